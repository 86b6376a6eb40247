// out[n] = alpha * W[n, :] . x + beta * out[n] for a row-major W [N, K]: the M = 1 (decode) case
// of linear_forward. S warps per output row (each a slice of k, gemv_split.h), 16-byte
// streaming loads of W (read once, so __ldcs keeps it from evicting x and other data from L2)
// when K is a multiple of 4 and the pointers are 16-byte aligned. beta = 0 never reads out.
//
// Why split k: the MoE routers (f32 weights, n = 256 experts, k = 2304 on the 48B-shaped model)
// had one warp per row, 32 blocks for 132 SMs: 6.6 us a call for 2.4 MB (0.36 TB/s; ncu, s19a).
// A row's sum is the lane sums of each slice (warp_sum's fixed order), then the S slices in
// order: it does not depend on the other rows.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemv_split.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/pdl.h"

namespace loom::cuda {
namespace {

constexpr int kWarps = kGemvMaxSplit;

// x f32, or bf16 (XT = uint16_t: its raw bits) widened exactly as it is read.
__device__ __forceinline__ float4 load_x4(const float* x, int64_t i) {
  return reinterpret_cast<const float4*>(x)[i];
}
__device__ __forceinline__ float4 load_x4(const uint16_t* x, int64_t i) {
  const uint2 b = reinterpret_cast<const uint2*>(x)[i];
  return make_float4(__uint_as_float(b.x << 16), __uint_as_float(b.x & 0xffff0000u),
                     __uint_as_float(b.y << 16), __uint_as_float(b.y & 0xffff0000u));
}
__device__ __forceinline__ float load_x1(const float* x, int64_t i) { return x[i]; }
__device__ __forceinline__ float load_x1(const uint16_t* x, int64_t i) {
  return __uint_as_float(static_cast<uint32_t>(x[i]) << 16);
}

// PDL-aware (kernels/cuda/pdl.h): rows below prefetch_rows go to L2 before the wait.
template <bool kVec, int S, typename XT>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_rows_kernel(const float* __restrict__ w, const XT* __restrict__ x, float* __restrict__ out,
                     int64_t n, int64_t k, float alpha, float beta, int64_t prefetch_rows) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int part = warp % S;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kWarps / S) + warp / S;
  const bool live = row < n;  // uniform across the warp
  if constexpr (kVec) {       // rows of 16-byte multiples, 16-byte aligned
    if (row < prefetch_rows && part == 0 && lane == 0)
      dev::prefetch_l2(w + row * k, static_cast<uint32_t>(k * 4));
  }
  dev::pdl_wait();
  float acc = 0.0f;
  if (live) {
    const float* wr = w + row * k;
    if constexpr (kVec) {
      const float4* w4 = reinterpret_cast<const float4*>(wr);
      const int64_t k4 = k / 4;
#pragma unroll 4
      for (int64_t i = part * 32 + lane; i < k4; i += 32 * S) {
        const float4 a = __ldcs(w4 + i);
        const float4 b = load_x4(x, i);
        acc += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
      }
    } else {
#pragma unroll 4
      for (int64_t i = part * 32 + lane; i < k; i += 32 * S) acc += __ldcs(wr + i) * load_x1(x, i);
    }
  }
  acc = dev::warp_sum(acc);
  if constexpr (S > 1) {
    __shared__ float partial[kWarps];
    if (lane == 0) partial[warp] = acc;
    __syncthreads();
    if (part != 0) return;
    for (int j = 1; j < S; ++j) acc += partial[warp + j];
  }
  if (live && lane == 0) out[row] = beta == 0.0f ? alpha * acc : alpha * acc + beta * out[row];
}

template <int S, typename XT>
void launch_split(cudaStream_t stream, bool vec, const float* w, const XT* x, float* out, int64_t n,
                  int64_t k, float alpha, float beta) {
  const int64_t blocks = (n + kWarps / S - 1) / (kWarps / S);
  LOOM_CHECK_GRID(blocks);
  if (vec) {
    constexpr auto kernel = gemv_rows_kernel<true, S, XT>;
    static const bool marked = (mark_pdl_kernel(reinterpret_cast<const void*>(kernel)), true);
    (void)marked;
    kernel<<<static_cast<unsigned>(blocks), kWarps * 32, 0, stream>>>(w, x, out, n, k, alpha, beta,
                                                                      pdl_prefetch_rows(n, k * 4));
  } else {
    constexpr auto kernel = gemv_rows_kernel<false, S, XT>;
    static const bool marked = (mark_pdl_kernel(reinterpret_cast<const void*>(kernel)), true);
    (void)marked;
    kernel<<<static_cast<unsigned>(blocks), kWarps * 32, 0, stream>>>(w, x, out, n, k, alpha, beta,
                                                                      0);
  }
}

template <typename XT>
void gemv_rows_any(cudaStream_t stream, const float* w, const XT* x, float* out, int64_t n,
                   int64_t k, float alpha, float beta) {
  if (n == 0) return;
  // 16-byte rows of w; x's 4-element units are 16 (f32) or 8 (bf16) bytes.
  const bool vec = k % 4 == 0 && (reinterpret_cast<uintptr_t>(w) & 15u) == 0 &&
                   (reinterpret_cast<uintptr_t>(x) & (sizeof(XT) * 4 - 1)) == 0;
  switch (gemv_split(n, k)) {
    case 1:
      launch_split<1>(stream, vec, w, x, out, n, k, alpha, beta);
      break;
    case 2:
      launch_split<2>(stream, vec, w, x, out, n, k, alpha, beta);
      break;
    case 4:
      launch_split<4>(stream, vec, w, x, out, n, k, alpha, beta);
      break;
    default:
      launch_split<8>(stream, vec, w, x, out, n, k, alpha, beta);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace

namespace launch {
void gemv_rows(cudaStream_t stream, const float* w, const float* x, float* out, int64_t n,
               int64_t k, float alpha, float beta) {
  gemv_rows_any(stream, w, x, out, n, k, alpha, beta);
}
void gemv_rows_bf16x(cudaStream_t stream, const float* w, const uint16_t* x, float* out, int64_t n,
                     int64_t k, float alpha, float beta) {
  gemv_rows_any(stream, w, x, out, n, k, alpha, beta);
}
}  // namespace launch

}  // namespace loom::cuda
