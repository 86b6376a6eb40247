// Ranks that are threads of one process, and their collectives over shared memory: the CPU
// expert-parallel transport (CI tests expert parallelism with it, without GPUs).
//
// A collective posts every rank's buffers to the group, waits at an entry barrier, lets each rank
// copy (or sum) what it needs straight from its peers' buffers, and waits at an exit barrier
// before anyone may reuse its buffers. Only the entry barrier can fail: when the group has failed
// (a rank aborted) or when some rank does not arrive within the group's timeout (it hangs, died,
// or runs other collectives): the waiting ranks then fail the whole group with DeadlineExceeded
// naming the missing ranks. Past the entry barrier every rank is inside the collective, copying
// memory, so the exit barrier always completes. Ranks posting different collectives (out of
// lockstep), shapes or counts fail the group with Internal, naming both.
#pragma once

#include <functional>
#include <memory>

#include "absl/time/time.h"
#include "engine/parallel/communicator.h"
#include "engine/parallel/rank_group.h"

namespace loom {

class ThreadGroup final : public RankGroup {
 public:
  // A group of `size` >= 1 ranks on the host; a rank waiting longer than `timeout` at a
  // collective's entry fails the group.
  ThreadGroup(int size, absl::Duration timeout);
  ThreadGroup(const ThreadGroup&) = delete;
  ThreadGroup& operator=(const ThreadGroup&) = delete;
  ~ThreadGroup();

  int size() const override;
  // Rank r's communicator, owned by the group; to be used by one thread (the rank's).
  Communicator& rank(int r);
  void abort(const absl::Status& why) override;
  absl::Status status() const override;
  // Every rank is local.
  int local_size() const override { return size(); }
  int first_rank() const override { return 0; }
  Communicator& local_rank(int i) override { return rank(i); }

  struct State;

 private:
  std::unique_ptr<State> state_;
};

// Runs body(comm) for ranks 0..size-1 over a fresh ThreadGroup: run_local_ranks (rank_group.h).
absl::Status run_thread_ranks(int size, absl::Duration timeout,
                              const std::function<absl::Status(Communicator&)>& body,
                              int threads_per_rank = 0);

}  // namespace loom
