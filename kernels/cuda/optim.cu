// CUDA kernels of the optimizer (kernels/cuda/optim.h).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/optim.h"

namespace loom::cuda {
namespace {

constexpr int kThreads = 256;

// One element of the update, every rounding spelled out (no contraction left to the compiler),
// so that the per-tensor and the multi-tensor kernels give the same bits.
__device__ __forceinline__ void adamw_element(float& p, float g, float& m, float& v,
                                              float grad_scale, float beta1, float beta2, float eps,
                                              float step_size, float sqrt_bc2, float decay) {
  const float gi = __fmul_rn(g, grad_scale);
  const float mi = __fadd_rn(__fmul_rn(beta1, m), __fmul_rn(1.0f - beta1, gi));
  const float vi = __fadd_rn(__fmul_rn(beta2, v), __fmul_rn(__fmul_rn(1.0f - beta2, gi), gi));
  m = mi;
  v = vi;
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), sqrt_bc2), eps);
  p = __fsub_rn(__fmul_rn(p, decay), __fdiv_rn(__fmul_rn(step_size, mi), denom));
}

__global__ void __launch_bounds__(kThreads)
    adamw_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                 float* __restrict__ v, int64_t n, float grad_scale, float beta1, float beta2,
                 float eps, float step_size, float sqrt_bc2, float decay) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    adamw_element(p[i], g[i], m[i], v[i], grad_scale, beta1, beta2, eps, step_size, sqrt_bc2,
                  decay);
}

// Block b updates elements [(b - first_block) * 4096, ...) of the last tensor whose first_block <=
// b, with adamw_kernel's arithmetic (the same bits), the gradient scale computed from the sum of
// squares on the device as the host computes it (kernels/optim.h, clipped_grad_scale).
__global__ void __launch_bounds__(kThreads)
    adamw_many_kernel(const __grid_constant__ launch::AdamWLaunch a) {
  const int b = static_cast<int>(blockIdx.x);
  int lo = 0, hi = a.count;  // a.e[lo].first_block <= b < a.e[hi].first_block (or hi == count)
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (a.e[mid].first_block <= b) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const launch::AdamWEntry& e = a.e[lo];
  const float grad_scale =
      static_cast<float>(clipped_grad_scale(*a.sum_squares, a.mean, a.clip_norm));
  const int64_t begin = static_cast<int64_t>(b - e.first_block) * launch::kAdamWBlock;
  const int64_t end = begin + launch::kAdamWBlock < e.n ? begin + launch::kAdamWBlock : e.n;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads)
    adamw_element(e.p[i], e.g[i], e.m[i], e.v[i], grad_scale, a.beta1, a.beta2, a.eps, a.step_size,
                  a.sqrt_bc2, e.decay);
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

void adamw_many(cudaStream_t stream, const AdamWLaunch& a) {
  adamw_many_kernel<<<static_cast<unsigned>(a.blocks), kThreads, 0, stream>>>(a);
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
