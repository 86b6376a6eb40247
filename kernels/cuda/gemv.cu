// out[n] = alpha * W[n, :] . x + beta * out[n] for a row-major W [N, K]: the M = 1 (decode) case
// of linear_forward. One warp per output row; 16-byte streaming loads of W (read once, so
// __ldcs keeps it from evicting x and other data from L2) when K is a multiple of 4 and the
// pointers are 16-byte aligned. beta = 0 never reads out.
#include "kernels/cuda/common.cuh"

namespace loom::cuda {
namespace {

constexpr int kWarps = 8;

template <bool kVec>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_rows_kernel(const float* __restrict__ w, const float* __restrict__ x,
                     float* __restrict__ out, int64_t n, int64_t k, float alpha, float beta) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (row >= n) return;  // uniform across the warp
  const float* wr = w + row * k;
  float acc = 0.0f;
  if constexpr (kVec) {
    const float4* w4 = reinterpret_cast<const float4*>(wr);
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const int64_t k4 = k / 4;
#pragma unroll 4
    for (int64_t i = lane; i < k4; i += 32) {
      const float4 a = __ldcs(w4 + i);
      const float4 b = x4[i];
      acc += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
    }
  } else {
#pragma unroll 4
    for (int64_t i = lane; i < k; i += 32) acc += __ldcs(wr + i) * x[i];
  }
  acc = dev::warp_sum(acc);
  if (lane == 0) out[row] = beta == 0.0f ? alpha * acc : alpha * acc + beta * out[row];
}

}  // namespace

namespace launch {
void gemv_rows(cudaStream_t stream, const float* w, const float* x, float* out, int64_t n,
               int64_t k, float alpha, float beta) {
  if (n == 0) return;
  const int64_t blocks = (n + kWarps - 1) / kWarps;
  LOOM_CHECK_GRID(blocks);
  const bool vec = k % 4 == 0 && (reinterpret_cast<uintptr_t>(w) & 15u) == 0 &&
                   (reinterpret_cast<uintptr_t>(x) & 15u) == 0;
  if (vec) {
    gemv_rows_kernel<true>
        <<<static_cast<unsigned>(blocks), kWarps * 32, 0, stream>>>(w, x, out, n, k, alpha, beta);
  } else {
    gemv_rows_kernel<false>
        <<<static_cast<unsigned>(blocks), kWarps * 32, 0, stream>>>(w, x, out, n, k, alpha, beta);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}
}  // namespace launch

}  // namespace loom::cuda
