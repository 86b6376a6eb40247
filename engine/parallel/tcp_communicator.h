// Expert-parallel ranks in several processes (on one host or several nodes) on the CPU: each
// process runs its local ranks as threads, as ThreadGroup does, and the processes meet over the
// rendezvous' TCP connections (node_rendezvous.h). This is how CI tests multi-node logic without
// GPUs; GPU ranks would use NCCL over the same rendezvous.
//
// A collective: the process's local ranks post their buffers and wait at a local entry barrier;
// the last to arrive leads. On node 0 the leader waits for every other node's posts (one kPost
// frame per node: its ranks' posts and send rows), checks that all ranks posted the same
// collective (collective_mismatch), computes every rank's result with the same function as the
// thread ranks (collective_result: reduce_scatter sums in rank order 0..size-1, so results are
// bit-identical to ThreadGroup's), writes its own ranks' and sends each node its ranks' (kReply).
// On another node the leader sends its kPost and waits for the kReply. Traffic goes through node
// 0 (a star): simple and enough for the CPU transport, not a design for bandwidth.
//
// Failure keeps the contract of communicator.h across processes: a rank's abort, a lockstep
// mismatch or a timeout fails the group everywhere (kAbort frames: node 0 relays a node's failure
// to the others, so every process reports the root cause). A process that dies or closes its
// connection fails the others at once (end of stream); one that stops answering fails them once
// nothing (not even its heartbeat) came for the timeout. Every wait is bounded: the local entry
// barrier and node 0's wait for the nodes by the timeout, a node's wait for node 0's reply by
// twice it (node 0 itself gives up after one timeout and says why).
//
// A node that leaves on purpose (the group object destroyed while healthy: kBye) is not a
// failure of the others' status(), since the nodes finish a run at slightly different times; a
// later collective that needs it fails at once, and departed() says who left.
#pragma once

#include <memory>

#include "absl/time/time.h"
#include "engine/parallel/node_rendezvous.h"
#include "engine/parallel/rank_group.h"

namespace loom {

class TcpGroup final : public RankGroup {
 public:
  // Takes the rendezvous' connections; this node runs its table entry's local ranks.
  TcpGroup(Rendezvous rendezvous, absl::Duration timeout);
  TcpGroup(const TcpGroup&) = delete;
  TcpGroup& operator=(const TcpGroup&) = delete;
  // Leaves the group: kBye to the peers while healthy, then closes the connections.
  ~TcpGroup() override;

  int size() const override;
  int local_size() const override;
  int first_rank() const override;
  Communicator& local_rank(int i) override;
  void abort(const absl::Status& why) override;
  absl::Status status() const override;

  int node_rank() const;
  int nnodes() const;
  // OK, or Unavailable naming the first peer node that left the group on purpose (kBye): a
  // server cannot serve without it, a finished run does not care.
  absl::Status departed() const override;

  struct State;

 private:
  std::unique_ptr<State> state_;
};

}  // namespace loom
