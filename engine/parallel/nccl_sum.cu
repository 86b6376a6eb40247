#include <algorithm>

#include "engine/parallel/nccl_sum.h"

namespace loom {
namespace {

// __fadd_rn: an addition nvcc may not contract into an FMA or reorder.
__global__ void sum_in_rank_order(const float* __restrict__ blocks, int64_t n, int size,
                                  float* __restrict__ out) {
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float acc = blocks[j];
    for (int q = 1; q < size; ++q) acc = __fadd_rn(acc, blocks[q * n + j]);
    out[j] = acc;
  }
}

}  // namespace

cudaError_t sum_blocks_in_rank_order(const float* blocks, int64_t n, int size, float* out,
                                     cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int threads = 256;
  const int grid = static_cast<int>(std::min<int64_t>((n + threads - 1) / threads, 4096));
  sum_in_rank_order<<<grid, threads, 0, stream>>>(blocks, n, size, out);
  return cudaGetLastError();
}

}  // namespace loom
