#include "engine/parallel/thread_communicator.h"

#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "core/status.h"
#include "engine/parallel/collective_post.h"

namespace loom {

absl::StatusOr<int64_t> lockstep_tokens(Communicator& comm, int64_t tokens) {
  int64_t mine = tokens;
  std::vector<int64_t> all(static_cast<size_t>(comm.size()));
  const Tensor send = Tensor::wrap(&mine, {1}, DType::kI64);
  const Tensor recv = Tensor::wrap(all.data(), {comm.size()}, DType::kI64);
  LOOM_RETURN_IF_ERROR(comm.all_gather(send, recv));
  int64_t sum = 0;
  for (int64_t n : all) sum += n;
  return sum;
}

class ThreadCommunicator;

struct ThreadGroup::State {
  State(int n, absl::Duration t) : size(n), timeout(t), posts(n), arrived(n, false) {}

  // Entry barrier: returns once every rank has arrived (OK), or the group's failure. A rank that
  // waits past the timeout fails the group with the ranks still missing.
  absl::Status enter(int rank, const CollectivePost& post) {
    absl::MutexLock lock(&mu);
    if (!failure.ok()) return failure;
    posts[rank] = post;
    const uint64_t gen = generation;
    arrived[rank] = true;
    if (++count == size) {
      release();
      return absl::OkStatus();
    }
    const absl::Time deadline = absl::Now() + timeout;
    while (generation == gen && failure.ok()) {
      if (cv.WaitWithDeadline(&mu, deadline) && generation == gen && failure.ok()) {
        std::vector<int> missing;
        for (int r = 0; r < size; ++r)
          if (!arrived[r]) missing.push_back(r);
        failure = absl::DeadlineExceededError(absl::StrCat(
            "expert-parallel group: rank ", rank, " waited ", absl::FormatDuration(timeout), " at ",
            collective_op_name(post.op), " #", post.seq, " for rank(s) ",
            absl::StrJoin(missing, ", "), " (failed, hung, or out of lockstep)"));
        cv.SignalAll();
      }
    }
    if (generation != gen) return absl::OkStatus();  // completed, even if the group failed since
    return failure;
  }

  // Exit barrier: every rank past the entry is only copying memory, so it always completes.
  void leave() {
    absl::MutexLock lock(&mu);
    const uint64_t gen = generation;
    if (++count == size) {
      count = 0;
      ++generation;
      cv.SignalAll();
      return;
    }
    while (generation == gen) cv.Wait(&mu);
  }

  void fail(const absl::Status& why) {
    absl::MutexLock lock(&mu);
    if (failure.ok()) failure = why.ok() ? absl::InternalError("aborted with OK") : why;
    cv.SignalAll();
  }

  absl::Status status() const {
    absl::MutexLock lock(&mu);
    return failure;
  }

  void release() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    count = 0;
    std::fill(arrived.begin(), arrived.end(), false);
    ++generation;
    cv.SignalAll();
  }

  const int size;
  const absl::Duration timeout;
  std::vector<std::unique_ptr<ThreadCommunicator>> ranks;

  mutable absl::Mutex mu;
  absl::CondVar cv;
  // Written by each rank before the entry barrier, read by all between the barriers.
  std::vector<CollectivePost> posts ABSL_GUARDED_BY(mu);
  std::vector<bool> arrived ABSL_GUARDED_BY(mu);
  int count ABSL_GUARDED_BY(mu) = 0;
  uint64_t generation ABSL_GUARDED_BY(mu) = 0;
  absl::Status failure ABSL_GUARDED_BY(mu);
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(ThreadGroup::State& group, int rank) : g_(group), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return g_.size; }

  absl::Status all_gather(const Tensor& send, const Tensor& recv) override {
    check_host(send, recv, "all_gather");
    check_all_gather_shapes(send, recv, size());
    const CollectivePost post{.op = CollectiveOp::kAllGather,
                              .send = static_cast<const char*>(send.raw()),
                              .dtype = send.dtype(),
                              .row_bytes = collective_row_bytes(send),
                              .send_rows = send.dim(0),
                              .recv_rows = recv.dim(0)};
    return run(post, recv);
  }

  absl::Status reduce_scatter(const Tensor& send, const Tensor& recv) override {
    check_host(send, recv, "reduce_scatter");
    check_reduce_scatter_shapes(send, recv, size());
    const CollectivePost post{.op = CollectiveOp::kReduceScatter,
                              .send = static_cast<const char*>(send.raw()),
                              .dtype = DType::kF32,
                              .row_bytes = collective_row_bytes(send),
                              .send_rows = send.dim(0),
                              .recv_rows = recv.dim(0)};
    return run(post, recv);
  }

  absl::Status all_to_all(const Tensor& send, std::span<const int64_t> send_counts,
                          const Tensor& recv, std::span<const int64_t> recv_counts) override {
    check_host(send, recv, "all_to_all");
    const auto [sent, received] =
        check_all_to_all_shapes(send, send_counts, recv, recv_counts, size());
    const CollectivePost post{.op = CollectiveOp::kAllToAll,
                              .send = static_cast<const char*>(send.raw()),
                              .dtype = send.dtype(),
                              .row_bytes = collective_row_bytes(send),
                              .send_rows = sent,
                              .recv_rows = received,
                              .send_counts = send_counts,
                              .recv_counts = recv_counts};
    return run(post, recv);
  }

  void abort(const absl::Status& why) override { g_.fail(why); }
  absl::Status status() const override { return g_.status(); }

 private:
  static void check_host(const Tensor& send, const Tensor& recv, const char* op) {
    LOOM_CHECK(send.device().is_cpu() && recv.device().is_cpu() && send.is_contiguous() &&
                   recv.is_contiguous() && send.ndim() >= 1 && recv.ndim() >= 1,
               "%s: thread ranks take contiguous host tensors (send %s, recv %s)", op,
               send.describe(), recv.describe());
  }

  // Entry barrier, lockstep check, the copy, exit barrier. Every rank sees the same posts, so all
  // agree on a mismatch and fail together.
  absl::Status run(CollectivePost post, const Tensor& recv) {
    post.seq = seq_++;
    LOOM_RETURN_IF_ERROR(g_.enter(rank_, post));
    std::vector<CollectivePost> posts;
    {
      absl::MutexLock lock(&g_.mu);
      posts = g_.posts;
    }
    const std::string why = collective_mismatch(posts);
    if (why.empty()) collective_result(posts, rank_, static_cast<char*>(recv.raw()));
    g_.leave();
    if (why.empty()) return absl::OkStatus();
    const absl::Status st = absl::InternalError(absl::StrCat("out of lockstep: ", why));
    g_.fail(st);
    return st;
  }

  ThreadGroup::State& g_;
  const int rank_;
  uint64_t seq_ = 0;  // collectives this rank has issued
};

ThreadGroup::ThreadGroup(int size, absl::Duration timeout)
    : state_(std::make_unique<State>(size, timeout)) {
  LOOM_CHECK(size >= 1, "ThreadGroup of %d ranks", size);
  for (int r = 0; r < size; ++r)
    state_->ranks.push_back(std::make_unique<ThreadCommunicator>(*state_, r));
}

ThreadGroup::~ThreadGroup() = default;

int ThreadGroup::size() const { return state_->size; }

Communicator& ThreadGroup::rank(int r) {
  LOOM_CHECK(r >= 0 && r < state_->size, "rank %d of %d", r, state_->size);
  return *state_->ranks[r];
}

void ThreadGroup::abort(const absl::Status& why) { state_->fail(why); }

absl::Status ThreadGroup::status() const { return state_->status(); }

absl::Status run_thread_ranks(int size, absl::Duration timeout,
                              const std::function<absl::Status(Communicator&)>& body,
                              int threads_per_rank) {
  ThreadGroup group(size, timeout);
  return run_local_ranks(group, body, threads_per_rank);
}

}  // namespace loom
