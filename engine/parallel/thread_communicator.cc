#include "engine/parallel/thread_communicator.h"

#include <omp.h>

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

namespace {

// What a rank posts for the collective in flight: read by its peers between the two barriers.
struct Post {
  const char* op = nullptr;
  uint64_t seq = 0;  // the rank's collective count: ranks in lockstep post the same
  const char* send = nullptr;
  DType dtype = DType::kF32;
  int64_t row_bytes = 0;  // bytes of one row (dims after the first)
  int64_t send_rows = 0, recv_rows = 0;
  std::span<const int64_t> send_counts, recv_counts;  // all_to_all
};

int64_t row_bytes_of(const Tensor& t) {
  int64_t n = static_cast<int64_t>(dtype_size(t.dtype()));
  for (int i = 1; i < t.ndim(); ++i) n *= t.dim(i);
  return n;
}

std::string describe_post(int rank, const Post& p) {
  return absl::StrCat("rank ", rank, " posted ", p.op, " #", p.seq, " (", p.send_rows, " rows of ",
                      p.row_bytes, " bytes, ", absl_sv(dtype_name(p.dtype)), ")");
}

}  // namespace

class ThreadCommunicator;

struct ThreadGroup::State {
  State(int n, absl::Duration t) : size(n), timeout(t), posts(n), arrived(n, false) {}

  // Entry barrier: returns once every rank has arrived (OK), or the group's failure. A rank that
  // waits past the timeout fails the group with the ranks still missing.
  absl::Status enter(int rank, const Post& post) {
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
            post.op, " #", post.seq, " for rank(s) ", absl::StrJoin(missing, ", "),
            " (failed, hung, or out of lockstep)"));
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
  std::vector<Post> posts ABSL_GUARDED_BY(mu);
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
    LOOM_CHECK(recv.dtype() == send.dtype() && row_bytes_of(recv) == row_bytes_of(send) &&
                   recv.dim(0) == send.dim(0) * size(),
               "all_gather: send %s, recv %s over %d ranks", send.describe(), recv.describe(),
               size());
    const Post post{.op = "all_gather",
                    .send = static_cast<const char*>(send.raw()),
                    .dtype = send.dtype(),
                    .row_bytes = row_bytes_of(send),
                    .send_rows = send.dim(0),
                    .recv_rows = recv.dim(0)};
    return run(post, [&](const std::vector<Post>& posts) {
      const int64_t block = send.dim(0) * post.row_bytes;
      for (int q = 0; q < size(); ++q)
        if (block > 0)
          std::memcpy(static_cast<char*>(recv.raw()) + q * block, posts[q].send, block);
    });
  }

  absl::Status reduce_scatter(const Tensor& send, const Tensor& recv) override {
    check_host(send, recv, "reduce_scatter");
    LOOM_CHECK(send.dtype() == DType::kF32 && recv.dtype() == DType::kF32 &&
                   row_bytes_of(recv) == row_bytes_of(send) && send.dim(0) == recv.dim(0) * size(),
               "reduce_scatter: send %s, recv %s over %d ranks (f32)", send.describe(),
               recv.describe(), size());
    const Post post{.op = "reduce_scatter",
                    .send = static_cast<const char*>(send.raw()),
                    .dtype = DType::kF32,
                    .row_bytes = row_bytes_of(send),
                    .send_rows = send.dim(0),
                    .recv_rows = recv.dim(0)};
    return run(post, [&](const std::vector<Post>& posts) {
      // Rank 0's block, then each later rank's added in order: the rank order of the contract.
      const int64_t n = recv.numel();
      float* out = recv.data<float>();
      for (int q = 0; q < size(); ++q) {
        const float* in = reinterpret_cast<const float*>(posts[q].send) + rank_ * n;
        if (q == 0) {
          std::copy(in, in + n, out);
        } else {
          for (int64_t j = 0; j < n; ++j) out[j] += in[j];
        }
      }
    });
  }

  absl::Status all_to_all(const Tensor& send, std::span<const int64_t> send_counts,
                          const Tensor& recv, std::span<const int64_t> recv_counts) override {
    check_host(send, recv, "all_to_all");
    LOOM_CHECK(static_cast<int>(send_counts.size()) == size() &&
                   static_cast<int>(recv_counts.size()) == size(),
               "all_to_all: %d send and %d recv counts over %d ranks", send_counts.size(),
               recv_counts.size(), size());
    int64_t sent = 0, received = 0;
    for (int q = 0; q < size(); ++q) {
      LOOM_CHECK(send_counts[q] >= 0 && recv_counts[q] >= 0, "all_to_all: negative count");
      sent += send_counts[q];
      received += recv_counts[q];
    }
    LOOM_CHECK(recv.dtype() == send.dtype() && row_bytes_of(recv) == row_bytes_of(send) &&
                   sent <= send.dim(0) && received <= recv.dim(0),
               "all_to_all: send %s for %d rows, recv %s for %d rows", send.describe(), sent,
               recv.describe(), received);
    const Post post{.op = "all_to_all",
                    .send = static_cast<const char*>(send.raw()),
                    .dtype = send.dtype(),
                    .row_bytes = row_bytes_of(send),
                    .send_rows = sent,
                    .recv_rows = received,
                    .send_counts = send_counts,
                    .recv_counts = recv_counts};
    return run(post, [&](const std::vector<Post>& posts) {
      char* out = static_cast<char*>(recv.raw());
      for (int q = 0; q < size(); ++q) {
        int64_t from = 0;  // q's rows for ranks before this one
        for (int r = 0; r < rank_; ++r) from += posts[q].send_counts[r];
        const int64_t bytes = recv_counts[q] * post.row_bytes;
        if (bytes > 0) std::memcpy(out, posts[q].send + from * post.row_bytes, bytes);
        out += bytes;
      }
    });
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

  // Why the ranks' posts cannot run as one collective, or "" when they can.
  std::string mismatch(const std::vector<Post>& posts) const {
    const Post& a = posts[0];
    for (int q = 1; q < size(); ++q) {
      const Post& b = posts[q];
      if (std::strcmp(a.op, b.op) != 0 || a.seq != b.seq || a.dtype != b.dtype ||
          a.row_bytes != b.row_bytes ||
          (std::strcmp(a.op, "all_to_all") != 0 &&
           (a.send_rows != b.send_rows || a.recv_rows != b.recv_rows)))
        return absl::StrCat(describe_post(0, a), " but ", describe_post(q, b));
    }
    if (std::strcmp(a.op, "all_to_all") == 0) {
      for (int q = 0; q < size(); ++q)
        for (int r = 0; r < size(); ++r)
          if (posts[q].send_counts[r] != posts[r].recv_counts[q])
            return absl::StrCat("all_to_all #", a.seq, ": rank ", q, " sends ",
                                posts[q].send_counts[r], " rows to rank ", r, ", which expects ",
                                posts[r].recv_counts[q]);
    }
    return "";
  }

  // Entry barrier, lockstep check, the copy, exit barrier. Every rank sees the same posts, so all
  // agree on a mismatch and fail together.
  template <typename Copy>
  absl::Status run(Post post, Copy copy) {
    post.seq = seq_++;
    LOOM_RETURN_IF_ERROR(g_.enter(rank_, post));
    std::vector<Post> posts;
    {
      absl::MutexLock lock(&g_.mu);
      posts = g_.posts;
    }
    const std::string why = mismatch(posts);
    if (why.empty()) copy(posts);
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
  // The ranks share the machine's cores (measured on 2 cores: 3 ranks of 2 OpenMP threads each
  // run 10x slower than 3 of 1).
  if (threads_per_rank <= 0) threads_per_rank = std::max(1, omp_get_max_threads() / size);
  {
    std::vector<std::thread> threads;
    for (int r = 0; r < size; ++r) {
      threads.emplace_back([&, r] {
        omp_set_num_threads(threads_per_rank);  // this thread's own setting
        absl::Status st;
        try {
          st = body(group.rank(r));
        } catch (const std::exception& e) {
          st = absl::InternalError(absl::StrCat("threw: ", e.what()));
        } catch (...) {
          st = absl::InternalError("threw a non-standard exception");
        }
        // A rank's own failure becomes the group's (if first), so its peers stop waiting for it.
        if (!st.ok())
          group.abort(absl::Status(st.code(), absl::StrCat("rank ", r, ": ", st.message())));
      });
    }
    for (std::thread& t : threads) t.join();
  }
  return group.status();
}

}  // namespace loom
