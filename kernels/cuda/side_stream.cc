#include "kernels/cuda/side_stream.h"

#include <cuda_runtime.h>

#include <array>

#include "core/status.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/launch.h"

namespace loom::cuda {
namespace {

constexpr int kMaxSideDevices = 64;

struct SideStream {
  cudaStream_t stream = nullptr;
  cudaEvent_t forked = nullptr, joined = nullptr;  // no timing: the cheapest record and wait
  bool open = false;                               // forked and not yet joined
};

// Per thread: two engine ranks on one device (threads) must not share a stream's fork state. The
// streams and events live as long as the thread's first use of them needs (never destroyed, as
// the device contexts).
SideStream& side_of(int device) {
  LOOM_CHECK(device >= 0 && device < kMaxSideDevices, "side stream: device %d", device);
  thread_local std::array<SideStream, kMaxSideDevices> sides;
  SideStream& s = sides[static_cast<size_t>(device)];
  if (s.stream == nullptr) {
    const DeviceGuard on(device);
    LOOM_CUDA_CHECK(cudaStreamCreate(&s.stream));  // blocking, as the device context's own
    LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&s.forked, cudaEventDisableTiming));
    LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&s.joined, cudaEventDisableTiming));
  }
  return s;
}

}  // namespace

void* fork_side_stream(const Exec& ex) {
  SideStream& s = side_of(ex.device.index);
  LOOM_CHECK(!s.open, "fork_side_stream: the side stream of cuda:%d is already forked",
             ex.device.index);
  LOOM_CUDA_CHECK(cudaEventRecord(s.forked, stream_of(ex)));
  LOOM_CUDA_CHECK(cudaStreamWaitEvent(s.stream, s.forked, 0));
  s.open = true;
  return s.stream;
}

void join_side_stream(const Exec& ex, const Exec& side) {
  SideStream& s = side_of(ex.device.index);
  LOOM_CHECK(s.open && side.stream == s.stream,
             "join_side_stream: no side stream of cuda:%d is forked here", ex.device.index);
  LOOM_CUDA_CHECK(cudaEventRecord(s.joined, s.stream));
  LOOM_CUDA_CHECK(cudaStreamWaitEvent(stream_of(ex), s.joined, 0));
  s.open = false;
}

}  // namespace loom::cuda
