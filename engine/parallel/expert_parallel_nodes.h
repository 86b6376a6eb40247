// Where the ranks of an expert-parallel group run: all in this process (threads), or spread over
// several processes, one per node (--nnodes K --node_rank r --coordinator HOST:PORT). Shared by
// loom-server and loom-conformance so both read the flags the same way:
//
//  - --expert_parallel N is the size of the whole group (the experts are split N ways, whatever
//    the node count); each node runs N / K of the ranks as threads, node r ranks
//    r * N / K .. (r + 1) * N / K - 1 (the coordinator assigns them in node order).
//  - N must be a multiple of K; --coordinator is required with K >= 2 and refused with K = 1.
//  - The nodes must agree on N, K and the caller's settings (the model, the exchange, numerics
//    flags); the rendezvous refuses any disagreement naming both nodes.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/parallel/rank_group.h"

namespace loom {

struct ExpertParallelNodes {
  int nnodes = 1;           // --nnodes
  int node_rank = 0;        // --node_rank
  std::string coordinator;  // --coordinator HOST:PORT (node 0 listens on PORT)
  bool multi() const { return nnodes > 1; }
};

// InvalidArgument, naming the flags, unless the combination is one described above for a group
// of `world` ranks.
absl::Status check_expert_parallel_nodes(const ExpertParallelNodes& nodes, int world);

// The ranks this process runs: a ThreadGroup of all `world` with one node, else (after the
// rendezvous, which waits for the other nodes up to `timeout`) this node's share of a TcpGroup.
// `settings` must be equal on every node.
absl::StatusOr<std::unique_ptr<RankGroup>> create_rank_group(
    const ExpertParallelNodes& nodes, int world, absl::Duration timeout,
    std::vector<std::pair<std::string, std::string>> settings);

// A 64-bit FNV-1a hash of `bytes` in hex: a setting that identifies a file's contents (the
// model's config.json) without sending it.
std::string content_fingerprint(std::string_view bytes);

}  // namespace loom
