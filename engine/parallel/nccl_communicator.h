// NCCL ranks on GPUs (issue 16), one rank per local GPU, in one process per node, behind the same
// Communicator contract as the thread and TCP ranks (communicator.h). Built in CUDA builds with
// NCCL (the `cuda` preset); not wired into loom-server or loom-conformance yet (they refuse
// --expert_parallel on CUDA: the expert dispatcher's index work is host-only), and NOT RUN with
// two ranks: no 2-GPU machine was lent when it was written. tests/gpu/nccl_communicator_cuda_test
// compares it with the thread ranks wherever a machine shows 2 or more GPUs.
//
// How the contract is kept:
//  - The NCCL unique id travels in the rendezvous' blob (node 0 makes it: nccl_unique_id), and
//    the rendezvous' connections stay open as the control plane: a TcpGroup that relays aborts
//    and detects lost or silent nodes (tcp_communicator.h); its status is this group's.
//  - Every collective runs on the stream of its rank's device context (kernels/cuda/context.h),
//    in order with the model's kernels, and the rank's thread then waits for it: polling the
//    stream, NCCL's asynchronous error, and the group's status, at most the group's timeout. Any
//    failure fails the group and aborts the rank's communicator (ncclCommAbort), so no rank waits
//    forever on a peer that left; each rank aborts its own communicator, on its own thread.
//  - reduce_scatter sums in rank order 0..size-1 (the contract; NCCL's own reduction order depends
//    on its algorithm): the blocks travel by grouped send/recv, then one kernel adds them in order,
//    so the results are the thread ranks' bits.
//  - Buffers are device tensors of the rank's GPU, contiguous, rows along dim 0.
// The waits are host syncs: correct, not yet the graph-capturable, sync-free path of issue 16.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/parallel/rank_group.h"
#include "engine/parallel/tcp_communicator.h"

namespace loom {

// A fresh ncclUniqueId's bytes: what node 0 puts in the rendezvous blob.
absl::StatusOr<std::string> nccl_unique_id();

class NcclGroup final : public RankGroup {
 public:
  // Creates this process's communicators: local rank i (rank control->first_rank() + i) on CUDA
  // device devices[i], from the unique id every node received in the rendezvous' blob. Fails
  // (aborting what it began) when a node does not join within `timeout`.
  static absl::StatusOr<std::unique_ptr<NcclGroup>> create(std::unique_ptr<TcpGroup> control,
                                                           const std::string& unique_id,
                                                           const std::vector<int>& devices,
                                                           absl::Duration timeout);
  ~NcclGroup() override;

  int size() const override;
  int local_size() const override;
  int first_rank() const override;
  Communicator& local_rank(int i) override;
  void abort(const absl::Status& why) override;
  absl::Status status() const override;
  absl::Status departed() const override;

  struct State;

 private:
  explicit NcclGroup(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace loom
