// The thread ranks' collectives (engine/parallel/thread_communicator.h): every primitive against a
// serial oracle at random sizes, uneven counts and ranks with nothing to send, the rank order of
// reduce_scatter's sum bit for bit, and the failure contract: a rank that fails, throws, hangs or
// leaves the lockstep makes every other rank return a clear error within a bounded time.
#include "engine/parallel/thread_communicator.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace loom {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A value no two (rank, row, column) share, exact in f32.
float tag(int rank, int64_t row, int64_t col) {
  return static_cast<float>(rank * 100000 + row * 100 + col);
}

TEST(ThreadCommunicator, AllGatherRandomSizesAndZeroRows) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 40; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 5);
    const int64_t rows = trial % 5 == 0 ? 0 : static_cast<int64_t>(rng() % 9);
    const int64_t cols = 1 + static_cast<int64_t>(rng() % 7);
    const DType dtype = trial % 2 ? DType::kF32 : DType::kI32;
    SCOPED_TRACE(testing::Message()
                 << "trial " << trial << ": " << n << " ranks, " << rows << " x " << cols);
    const absl::Status st =
        run_thread_ranks(n, absl::Seconds(20), [&](Communicator& comm) -> absl::Status {
          const int r = comm.rank();
          Tensor send = Tensor::empty({rows, cols}, dtype),
                 recv = Tensor::empty({n * rows, cols}, dtype);
          for (int64_t i = 0; i < rows; ++i)
            for (int64_t c = 0; c < cols; ++c) {
              if (dtype == DType::kF32)
                send.data<float>()[i * cols + c] = tag(r, i, c);
              else
                send.data<int32_t>()[i * cols + c] = static_cast<int32_t>(tag(r, i, c));
            }
          if (absl::Status s = comm.all_gather(send, recv); !s.ok()) return s;
          for (int q = 0; q < n; ++q)
            for (int64_t i = 0; i < rows; ++i)
              for (int64_t c = 0; c < cols; ++c) {
                const int64_t at = (q * rows + i) * cols + c;
                const float got = dtype == DType::kF32
                                      ? recv.data<float>()[at]
                                      : static_cast<float>(recv.data<int32_t>()[at]);
                if (got != tag(q, i, c))
                  return absl::InternalError(absl::StrCat("rank ", r, " row ", q * rows + i));
              }
          return absl::OkStatus();
        });
    EXPECT_TRUE(st.ok()) << st;
  }
}

// The sum runs in rank order on every element: compared bit for bit with a serial sum in that
// order (values of very different magnitudes, so another order would round differently).
TEST(ThreadCommunicator, ReduceScatterSumsInRankOrder) {
  std::mt19937 rng(12);
  for (int trial = 0; trial < 30; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 5);
    const int64_t rows = trial % 6 == 0 ? 0 : static_cast<int64_t>(rng() % 6), cols = 1 + rng() % 9;
    std::vector<std::vector<float>> inputs(n);
    std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
    std::uniform_int_distribution<int> expo(-20, 20);
    for (auto& v : inputs) {
      v.resize(static_cast<size_t>(n * rows * cols));
      for (float& x : v) x = std::ldexp(mant(rng), expo(rng));
    }
    std::vector<float> want(static_cast<size_t>(n * rows * cols));
    for (size_t j = 0; j < want.size(); ++j) {
      float acc = inputs[0][j];
      for (int q = 1; q < n; ++q) acc += inputs[q][j];
      want[j] = acc;
    }
    const absl::Status st =
        run_thread_ranks(n, absl::Seconds(20), [&](Communicator& comm) -> absl::Status {
          const int r = comm.rank();
          const Tensor send = Tensor::wrap(inputs[r].data(), {n * rows, cols}, DType::kF32);
          Tensor recv = Tensor::empty({rows, cols});
          if (absl::Status s = comm.reduce_scatter(send, recv); !s.ok()) return s;
          if (recv.numel() > 0 &&
              std::memcmp(recv.raw(), want.data() + r * rows * cols, recv.nbytes()) != 0)
            return absl::InternalError(absl::StrCat("rank ", r, ": not the rank-order sum"));
          return absl::OkStatus();
        });
    EXPECT_TRUE(st.ok()) << "trial " << trial << ": " << st;
  }
}

// Random count matrices with zeros (a rank sending to nobody, a rank receiving nothing), rows that
// name their source, destination and index.
TEST(ThreadCommunicator, AllToAllUnevenCounts) {
  std::mt19937 rng(13);
  for (int trial = 0; trial < 40; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 5);
    const int64_t cols = 1 + rng() % 4;
    std::vector<std::vector<int64_t>> counts(n, std::vector<int64_t>(n));  // [from][to]
    const int silent = static_cast<int>(rng() % n);
    for (int a = 0; a < n; ++a)
      for (int b = 0; b < n; ++b)
        counts[a][b] = (a == silent || b == silent || rng() % 4 == 0) ? 0 : rng() % 7;
    const absl::Status st =
        run_thread_ranks(n, absl::Seconds(20), [&](Communicator& comm) -> absl::Status {
          const int r = comm.rank();
          std::vector<int64_t> sends(n), recvs(n);
          int64_t out = 0, in = 0;
          for (int q = 0; q < n; ++q) {
            sends[q] = counts[r][q];
            recvs[q] = counts[q][r];
            out += sends[q];
            in += recvs[q];
          }
          Tensor send = Tensor::empty({out, cols}), recv = Tensor::empty({in, cols});
          int64_t row = 0;
          for (int q = 0; q < n; ++q)
            for (int64_t i = 0; i < sends[q]; ++i, ++row)
              for (int64_t c = 0; c < cols; ++c)
                send.data<float>()[row * cols + c] = tag(r * 10 + q, i, c);
          if (absl::Status s = comm.all_to_all(send, sends, recv, recvs); !s.ok()) return s;
          row = 0;
          for (int q = 0; q < n; ++q)
            for (int64_t i = 0; i < recvs[q]; ++i, ++row)
              for (int64_t c = 0; c < cols; ++c)
                if (recv.data<float>()[row * cols + c] != tag(q * 10 + r, i, c))
                  return absl::InternalError(absl::StrCat("rank ", r, " row ", row));
          return absl::OkStatus();
        });
    EXPECT_TRUE(st.ok()) << "trial " << trial << ": " << st;
  }
}

TEST(ThreadCommunicator, LockstepTokensSumsEveryRank) {
  const absl::Status st = run_thread_ranks(4, absl::Seconds(20), [](Communicator& comm) {
    absl::StatusOr<int64_t> total = lockstep_tokens(comm, comm.rank() == 2 ? 0 : comm.rank() + 1);
    if (!total.ok()) return total.status();
    return *total == 1 + 2 + 4 ? absl::OkStatus() : absl::InternalError("wrong sum");
  });
  EXPECT_TRUE(st.ok()) << st;
}

// A rank that returns an error: the others, blocked in a collective, return at once (well before
// the timeout) with an error naming the failed rank, and the run returns the root cause.
TEST(ThreadCommunicator, FailingRankReleasesTheOthers) {
  std::vector<double> waited(3, -1);
  std::vector<absl::Status> seen(3);
  const auto t0 = Clock::now();
  const absl::Status st =
      run_thread_ranks(3, absl::Seconds(30), [&](Communicator& comm) -> absl::Status {
        const int r = comm.rank();
        if (r == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          return absl::InvalidArgumentError("bad batch");
        }
        Tensor send = Tensor::zeros({2, 3}), recv = Tensor::empty({6, 3});
        seen[r] = comm.all_gather(send, recv);
        waited[r] = seconds_since(t0);
        // Later collectives fail at once too.
        const absl::Status again = comm.all_gather(send, recv);
        return again.ok() ? absl::InternalError("collective after failure succeeded") : again;
      });
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_EQ(st.message(), "rank 1: bad batch");
  for (int r : {0, 2}) {
    EXPECT_FALSE(seen[r].ok());
    EXPECT_NE(seen[r].message().find("rank 1: bad batch"), std::string::npos) << seen[r];
    EXPECT_LT(waited[r], 5.0) << "rank " << r << " waited for the timeout instead";
  }
}

TEST(ThreadCommunicator, ThrowingRankReleasesTheOthers) {
  std::atomic<int> released{0};
  const absl::Status st =
      run_thread_ranks(2, absl::Seconds(30), [&](Communicator& comm) -> absl::Status {
        if (comm.rank() == 0) throw std::runtime_error("kernel exploded");
        Tensor send = Tensor::zeros({1}), recv = Tensor::empty({2});
        const absl::Status s = comm.all_gather(send, recv);
        released += !s.ok();
        return s;
      });
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_NE(st.message().find("rank 0: threw: kernel exploded"), std::string::npos) << st;
  EXPECT_EQ(released.load(), 1);
}

// A rank that never arrives (hung, or busy elsewhere) and never reports: the waiting ranks give up
// after the timeout with DeadlineExceeded naming it, long before it would have come back.
TEST(ThreadCommunicator, HungRankTimesOut) {
  std::vector<double> waited(3, -1);
  const auto t0 = Clock::now();
  const absl::Status st =
      run_thread_ranks(3, absl::Milliseconds(300), [&](Communicator& comm) -> absl::Status {
        const int r = comm.rank();
        if (r == 2) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1500));
          return absl::OkStatus();  // returns without ever joining
        }
        Tensor send = Tensor::zeros({1}), recv = Tensor::empty({3});
        const absl::Status s = comm.all_gather(send, recv);
        waited[r] = seconds_since(t0);
        return s;
      });
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_NE(st.message().find("for rank(s) 2"), std::string::npos) << st;
  for (int r : {0, 1}) {
    EXPECT_GE(waited[r], 0.29);
    EXPECT_LT(waited[r], 1.2) << "rank " << r;
  }
}

// Ranks issuing different collectives, or all_to_all counts that do not match, fail together
// with Internal naming both sides, instead of exchanging garbage.
TEST(ThreadCommunicator, OutOfLockstepFails) {
  const absl::Status st =
      run_thread_ranks(2, absl::Seconds(20), [](Communicator& comm) -> absl::Status {
        Tensor two = Tensor::zeros({2}), one = Tensor::empty({1});
        if (comm.rank() == 0) return comm.all_gather(one, two);
        return comm.reduce_scatter(two, one);
      });
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal) << st;
  EXPECT_NE(st.message().find("out of lockstep"), std::string::npos) << st;
  EXPECT_NE(st.message().find("reduce_scatter"), std::string::npos) << st;

  const absl::Status counts =
      run_thread_ranks(2, absl::Seconds(20), [](Communicator& comm) -> absl::Status {
        Tensor buf = Tensor::zeros({4}), out = Tensor::empty({4});
        const std::vector<int64_t> sends = {1, 2};
        const std::vector<int64_t> recvs =
            comm.rank() == 0 ? std::vector<int64_t>{1, 1} : std::vector<int64_t>{1, 2};
        return comm.all_to_all(buf, sends, out, recvs);
      });
  EXPECT_EQ(counts.code(), absl::StatusCode::kInternal) << counts;
  EXPECT_NE(counts.message().find("rank 0 sends 2 rows to rank 1, which expects 1"),
            std::string::npos)
      << counts;
}

}  // namespace
}  // namespace loom
