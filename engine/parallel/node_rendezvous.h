// How the processes of one expert-parallel group find each other (issue 16: --nnodes K,
// --node_rank r, --coordinator HOST:PORT, torchrun-style). Node 0 listens on the coordinator's
// port; every other node connects (retrying until the timeout: node 0 may start later) and says
// who it is: its node rank, how many local ranks it runs, the group size it expects, and the
// settings that must agree (the model, the exchange, numerics flags). Node 0 checks them all,
// assigns the ranks in node order (node 0 first), and sends every node the node table and an
// opaque blob (what an NCCL unique id travels in). Any disagreement fails every node with one
// message naming both sides; a node that does not come within the timeout fails the others.
//
// The connections stay open: node 0 holds one to every node, each node one to node 0. The CPU
// transport (tcp_communicator.h) runs the collectives and the liveness checks over them.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/parallel/node_socket.h"
#include "engine/parallel/node_wire.h"

namespace loom {

struct RendezvousOptions {
  int nnodes = 1;
  int node_rank = 0;
  HostPort coordinator;  // node 0 listens on its port (every interface); the others connect
  int local_ranks = 1;   // ranks this node runs
  int world_size = 1;    // ranks the group must have in all
  // Must be equal on every node (key = value; compared as strings).
  std::vector<std::pair<std::string, std::string>> settings;
  std::string blob;  // node 0's, given to every node
  absl::Duration timeout = absl::Seconds(300);
};

struct Rendezvous {
  int node_rank = 0;
  std::vector<NodeInfo> nodes;  // node order; nodes[i].first_rank assigned by node 0
  std::string blob;
  // Node 0: peers[m] is node m's connection (peers[0] empty). Another node: peers[0], node 0's.
  std::vector<Socket> peers;
};

// Runs the rendezvous. Node 0 may pass a listener it already bound (tests bind port 0 to get a
// free one); otherwise it binds options.coordinator's port.
absl::StatusOr<Rendezvous> rendezvous(const RendezvousOptions& options, Socket* listener = nullptr);

// The setting on which two nodes disagree, as "node A (...) has K=V1 but node B (...) has K=V2",
// or "" when they agree. Also names a setting one has and the other lacks.
std::string settings_mismatch(const NodeHello& a, const NodeHello& b);

}  // namespace loom
