// The random-fill kernel: a grid-stride loop, each element from its own counter
// (kernels/random_fill_math.h), so the grid shape never changes a value.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/random_fill_launch.h"
#include "kernels/random_fill_math.h"

namespace loom::cuda {
namespace {

template <bool kBf16>
__global__ void random_fill_kernel(void* out, int64_t n, uint64_t key, uint64_t first, float center,
                                   float step) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v =
        random_fill_math::uniform_value(key, first + static_cast<uint64_t>(i), center, step);
    if constexpr (kBf16) {
      static_cast<uint16_t*>(out)[i] = random_fill_math::to_bf16(v);
    } else {
      static_cast<float*>(out)[i] = v;
    }
  }
}

constexpr int kThreads = 256;

}  // namespace

namespace launch {

void random_fill(cudaStream_t stream, void* out, bool bf16, int64_t n, uint64_t key, uint64_t first,
                 float center, float step) {
  if (n == 0) return;
  const unsigned grid = dev::grid_for(n, kThreads);
  if (bf16) {
    random_fill_kernel<true><<<grid, kThreads, 0, stream>>>(out, n, key, first, center, step);
  } else {
    random_fill_kernel<false><<<grid, kThreads, 0, stream>>>(out, n, key, first, center, step);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace launch
}  // namespace loom::cuda
