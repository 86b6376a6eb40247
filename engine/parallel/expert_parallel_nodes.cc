#include "engine/parallel/expert_parallel_nodes.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/parallel/node_rendezvous.h"
#include "engine/parallel/tcp_communicator.h"
#include "engine/parallel/thread_communicator.h"

namespace loom {

absl::Status check_expert_parallel_nodes(const ExpertParallelNodes& n, int world) {
  if (n.nnodes < 1)
    return absl::InvalidArgumentError(absl::StrCat("--nnodes ", n.nnodes, ": expected >= 1"));
  if (n.node_rank < 0 || n.node_rank >= n.nnodes)
    return absl::InvalidArgumentError(absl::StrCat(
        "--node_rank ", n.node_rank, ": expected 0 <= node_rank < --nnodes ", n.nnodes));
  if (n.nnodes == 1) {
    if (!n.coordinator.empty())
      return absl::InvalidArgumentError(
          absl::StrCat("--coordinator ", n.coordinator, " joins nodes: it needs --nnodes K >= 2"));
    return absl::OkStatus();
  }
  if (n.coordinator.empty())
    return absl::InvalidArgumentError(
        absl::StrCat("--nnodes ", n.nnodes, " needs --coordinator HOST:PORT (node 0's address)"));
  if (absl::StatusOr<HostPort> hp = parse_host_port(n.coordinator, "coordinator"); !hp.ok())
    return hp.status();
  if (world < n.nnodes || world % n.nnodes != 0)
    return absl::InvalidArgumentError(absl::StrCat(
        "--expert_parallel ", world, " with --nnodes ", n.nnodes,
        ": --expert_parallel is the number of ranks of the whole group, a multiple of --nnodes "
        "(each node runs the same number of them)"));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RankGroup>> create_rank_group(
    const ExpertParallelNodes& nodes, int world, absl::Duration timeout,
    std::vector<std::pair<std::string, std::string>> settings) {
  if (absl::Status st = check_expert_parallel_nodes(nodes, world); !st.ok()) return st;
  if (!nodes.multi()) return std::make_unique<ThreadGroup>(world, timeout);
  absl::StatusOr<HostPort> hp = parse_host_port(nodes.coordinator, "coordinator");
  if (!hp.ok()) return hp.status();
  absl::StatusOr<Rendezvous> rv = rendezvous({.nnodes = nodes.nnodes,
                                              .node_rank = nodes.node_rank,
                                              .coordinator = *hp,
                                              .local_ranks = world / nodes.nnodes,
                                              .world_size = world,
                                              .settings = std::move(settings),
                                              .timeout = timeout});
  if (!rv.ok()) return rv.status();
  return std::make_unique<TcpGroup>(std::move(rv).value(), timeout);
}

std::string content_fingerprint(std::string_view bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return absl::StrFormat("%016x", h);
}

}  // namespace loom
