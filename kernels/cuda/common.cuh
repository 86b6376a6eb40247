// Device-side helpers shared by the .cu files (nvcc only).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/launch.h"

namespace loom::cuda::dev {

// Same formulas as the host helpers in kernels/activation.h (accurate expf/log1pf, no fast math).
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `smem` holds 32 floats. Contains __syncthreads: call from all threads.
__device__ __forceinline__ float block_sum(float v, float* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // smem may still be read from a previous call
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < nwarps ? smem[lane] : 0.0f;
  return warp_sum(v);
}

// Blocks for a grid-stride loop over n items with `threads` threads per block.
inline unsigned grid_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  const int64_t cap = 132 * 16;  // enough to fill an H100/H200 many times over
  return static_cast<unsigned>(b < 1 ? 1 : (b > cap ? cap : b));
}

}  // namespace loom::cuda::dev

#define LOOM_CUDA_CHECK_LAUNCH() LOOM_CUDA_CHECK(cudaGetLastError())
// Grid x-dimension limit (2^31 - 1 blocks) for kernels that map one block to one row.
#define LOOM_CHECK_GRID(n)                                                                      \
  do {                                                                                          \
    if ((n) > 2147483647LL) {                                                                   \
      std::fprintf(stderr, "%s:%d: %lld rows exceed the CUDA grid limit\n", __FILE__, __LINE__, \
                   static_cast<long long>(n));                                                  \
      std::abort();                                                                             \
    }                                                                                           \
  } while (0)
