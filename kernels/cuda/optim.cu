// CUDA kernels of the optimizer (kernels/cuda/optim.h).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/optim.h"

namespace loom::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    adamw_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                 float* __restrict__ v, int64_t n, float grad_scale, float beta1, float beta2,
                 float eps, float step_size, float sqrt_bc2, float decay) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const float gi = g[i] * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
    const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - step_size * mi / (sqrtf(vi) / sqrt_bc2 + eps);
  }
}

// One block per 4096 elements: each thread sums its 16 in order, then a tree over the block.
__global__ void __launch_bounds__(kThreads)
    sum_squares_partial_kernel(const float* __restrict__ x, int64_t n, double* __restrict__ part) {
  __shared__ double s[kThreads];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * launch::kSumSquaresBlock;
  double acc = 0.0;
  for (int64_t i = base + threadIdx.x; i < n && i < base + launch::kSumSquaresBlock; i += kThreads)
    acc += static_cast<double>(x[i]) * x[i];
  s[threadIdx.x] = acc;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) part[blockIdx.x] = s[0];
}

__global__ void sum_squares_total_kernel(const double* __restrict__ part, int64_t blocks,
                                         float* __restrict__ out) {
  double total = 0.0;
  for (int64_t b = 0; b < blocks; ++b) total += part[b];
  *out = static_cast<float>(total);
}

}  // namespace

namespace launch {
void adamw(cudaStream_t stream, float* p, const float* g, float* m, float* v, int64_t n,
           float grad_scale, float beta1, float beta2, float eps, float step_size, float sqrt_bc2,
           float decay) {
  if (n == 0) return;
  adamw_kernel<<<dev::grid_for(n, kThreads), kThreads, 0, stream>>>(
      p, g, m, v, n, grad_scale, beta1, beta2, eps, step_size, sqrt_bc2, decay);
  LOOM_CUDA_CHECK_LAUNCH();
}

void sum_of_squares(cudaStream_t stream, const float* x, int64_t n, double* partials, float* out) {
  const int64_t blocks = (n + kSumSquaresBlock - 1) / kSumSquaresBlock;
  if (blocks > 0) {
    LOOM_CHECK_GRID(blocks);
    sum_squares_partial_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(x, n,
                                                                                       partials);
    LOOM_CUDA_CHECK_LAUNCH();
  }
  sum_squares_total_kernel<<<1, 1, 0, stream>>>(partials, blocks, out);
  LOOM_CUDA_CHECK_LAUNCH();
}
}  // namespace launch

}  // namespace loom::cuda
