// NCCL ranks (engine/parallel/nccl_communicator.h) against the thread ranks on the host, bit for
// bit: every collective at random shapes, zero rows, uneven all_to_all counts with ranks that send
// or receive nothing, and reduce_scatter's rank-order sum over values of very different
// magnitudes. One process, one rank per visible GPU (2 or more; skipped with fewer), the control
// plane a one-node TcpGroup. Also: a rank that fails releases the others with its error, and a
// rank missing from a collective times out instead of hanging.
//
// Written while no 2-GPU machine was lent: not yet run (docs/expert-parallel.md).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/parallel/nccl_communicator.h"
#include "engine/parallel/thread_communicator.h"
#include "kernels/cuda/device.h"

namespace loom {
namespace {

int gpus() { return cuda::visible_devices(); }

// An NCCL group of one rank per visible GPU in this process.
absl::StatusOr<std::unique_ptr<NcclGroup>> make_group(absl::Duration timeout) {
  const int n = gpus();
  absl::StatusOr<std::string> id = nccl_unique_id();
  if (!id.ok()) return id.status();
  absl::StatusOr<Rendezvous> rv = rendezvous({.nnodes = 1, .local_ranks = n, .world_size = n});
  if (!rv.ok()) return rv.status();
  std::vector<int> devices;
  for (int i = 0; i < n; ++i) devices.push_back(i);
  return NcclGroup::create(std::make_unique<TcpGroup>(std::move(rv).value(), timeout), *id, devices,
                           timeout);
}

// Each rank's received bytes per step, on host or device ranks alike (inputs depend only on the
// rank and the step).
struct Script {
  bool on_gpu = false;
  std::vector<std::vector<std::vector<char>>>* received = nullptr;  // [rank][step]

  Tensor place(const Tensor& host, int rank) const {
    return on_gpu ? cuda::to_device(host, Device::cuda(rank)) : host;
  }

  absl::Status operator()(Communicator& comm) const {
    const int r = comm.rank(), n = comm.size();
    std::mt19937 shapes(7);
    for (int step = 0; step < 18; ++step) {
      std::mt19937 values(1000 * r + step);
      std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
      std::uniform_int_distribution<int> expo(-20, 20);
      const int64_t rows = step % 7 == 0 ? 0 : static_cast<int64_t>(shapes() % 6);
      const int64_t cols = 1 + static_cast<int64_t>(shapes() % 5);
      Tensor send, recv;
      absl::Status st;
      if (step % 3 == 0) {
        send = Tensor::empty({rows, cols}, DType::kI64);
        for (int64_t i = 0; i < send.numel(); ++i) send.data<int64_t>()[i] = values();
        send = place(send, r);
        recv = place(Tensor::zeros({n * rows, cols}, DType::kI64), r);
        st = comm.all_gather(send, recv);
      } else if (step % 3 == 1) {
        send = Tensor::empty({n * rows, cols});
        for (int64_t i = 0; i < send.numel(); ++i)
          send.data<float>()[i] = std::ldexp(mant(values), expo(values));
        send = place(send, r);
        recv = place(Tensor::zeros({rows, cols}), r);
        st = comm.reduce_scatter(send, recv);
      } else {
        std::vector<std::vector<int64_t>> counts(n, std::vector<int64_t>(n));
        const int silent = static_cast<int>(shapes() % n);
        for (int a = 0; a < n; ++a)
          for (int b = 0; b < n; ++b) {
            const int64_t c = static_cast<int64_t>(shapes() % 5);
            counts[a][b] = a == silent || b == silent ? 0 : c;
          }
        std::vector<int64_t> sends(n), recvs(n);
        int64_t out = 0, in = 0;
        for (int q = 0; q < n; ++q) {
          sends[q] = counts[r][q];
          recvs[q] = counts[q][r];
          out += sends[q];
          in += recvs[q];
        }
        send = Tensor::empty({out + 1, cols});
        for (int64_t i = 0; i < send.numel(); ++i) send.data<float>()[i] = mant(values);
        send = place(send, r);
        recv = place(Tensor::zeros({in, cols}), r);
        st = comm.all_to_all(send, sends, recv, recvs);
      }
      if (!st.ok()) return st;
      const Tensor host = on_gpu ? cuda::to_host(recv) : recv;
      const char* p = static_cast<const char*>(host.raw());
      (*received)[r].emplace_back(p, p + host.nbytes());
    }
    return absl::OkStatus();
  }
};

TEST(NcclCommunicator, EveryCollectiveMatchesThreadRanks) {
  if (gpus() < 2) GTEST_SKIP() << "needs 2 or more GPUs (" << gpus() << " visible)";
  absl::StatusOr<std::unique_ptr<NcclGroup>> group = make_group(absl::Seconds(60));
  ASSERT_TRUE(group.ok()) << group.status();
  const int n = (*group)->size();
  std::vector<std::vector<std::vector<char>>> nccl(n), threads(n);
  const absl::Status a = run_local_ranks(**group, Script{true, &nccl}, 1);
  ASSERT_TRUE(a.ok()) << a;
  const absl::Status b = run_thread_ranks(n, absl::Seconds(60), Script{false, &threads}, 1);
  ASSERT_TRUE(b.ok()) << b;
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(nccl[r].size(), threads[r].size());
    for (size_t s = 0; s < nccl[r].size(); ++s)
      EXPECT_EQ(nccl[r][s], threads[r][s]) << "rank " << r << " step " << s;
  }
}

TEST(NcclCommunicator, FailingRankReleasesTheOthers) {
  if (gpus() < 2) GTEST_SKIP() << "needs 2 or more GPUs (" << gpus() << " visible)";
  absl::StatusOr<std::unique_ptr<NcclGroup>> group = make_group(absl::Seconds(60));
  ASSERT_TRUE(group.ok()) << group.status();
  const absl::Status st = run_local_ranks(
      **group,
      [](Communicator& comm) -> absl::Status {
        if (comm.rank() == 1) return absl::InvalidArgumentError("bad batch");
        Tensor send = cuda::to_device(Tensor::zeros({2}), Device::cuda(comm.rank()));
        Tensor recv = cuda::to_device(Tensor::zeros({2 * comm.size()}), Device::cuda(comm.rank()));
        return comm.all_gather(send, recv);
      },
      1);
  EXPECT_EQ(st.message(), "rank 1: bad batch") << st;
}

TEST(NcclCommunicator, MissingRankTimesOut) {
  if (gpus() < 2) GTEST_SKIP() << "needs 2 or more GPUs (" << gpus() << " visible)";
  absl::StatusOr<std::unique_ptr<NcclGroup>> group = make_group(absl::Seconds(2));
  ASSERT_TRUE(group.ok()) << group.status();
  const absl::Status st = run_local_ranks(
      **group,
      [](Communicator& comm) -> absl::Status {
        if (comm.rank() != 0) {
          // Never joins: waits for the group to fail, then reports it.
          while (comm.status().ok()) absl::SleepFor(absl::Milliseconds(5));
          return comm.status();
        }
        Tensor send = cuda::to_device(Tensor::zeros({2}), Device::cuda(0));
        Tensor recv = cuda::to_device(Tensor::zeros({2 * comm.size()}), Device::cuda(0));
        return comm.all_gather(send, recv);
      },
      1);
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_NE(st.message().find("did not complete within 2s"), std::string::npos) << st;
}

}  // namespace
}  // namespace loom
