// The ranks of an expert-parallel group that run in this process: all of them (ThreadGroup, one
// process) or this node's share (TcpGroup, ranks in several processes or on several nodes). Each
// local rank is a thread with its own Communicator; the group's failure is sticky and shared by
// every rank of every process.
#pragma once

#include <functional>

#include "absl/status/status.h"
#include "engine/parallel/communicator.h"

namespace loom {

class RankGroup {
 public:
  virtual ~RankGroup() = default;
  virtual int size() const = 0;        // ranks in the whole group
  virtual int local_size() const = 0;  // ranks in this process
  virtual int first_rank() const = 0;  // the rank of local rank 0; the local ranks are consecutive
  // Local rank i's communicator (rank first_rank() + i), owned by the group; one thread uses it.
  virtual Communicator& local_rank(int i) = 0;
  // Fails the group (kept if first): every rank's pending and later collectives return it, in
  // every process. Any thread.
  virtual void abort(const absl::Status& why) = 0;
  // OK while healthy, else the group's first failure. Any thread.
  virtual absl::Status status() const = 0;
  // OK, or which process of the group has left it on purpose (ranks in several processes,
  // tcp_communicator.h): not a failure of a finished run, but the end of a serving group.
  virtual absl::Status departed() const { return absl::OkStatus(); }
};

// Runs body(comm) for each local rank of `group`, each on its own thread, and joins them. Each
// rank's OpenMP team has `threads_per_rank` threads, or with 0 an equal share of the cores (at
// least one): ranks that each spread over every core oversubscribe them. (The OpenMP build of
// OpenBLAS rounds a GEMM differently with its thread count, so a run meant to be bit-identical to
// one rank must give that rank the same count.) A rank whose body returns an error or throws
// aborts the group (its error, prefixed "rank R: "), so the other ranks' collectives return at
// once. Returns OK when every rank returned OK, else the group's first failure: the root cause,
// not the errors it then caused in the other ranks.
absl::Status run_local_ranks(RankGroup& group,
                             const std::function<absl::Status(Communicator&)>& body,
                             int threads_per_rank = 0);

}  // namespace loom
