// Loom's FP8-weight kernels (launchers in kernels/cuda/gemm_fp8_launch.h):
//  - gemv_fp8: decode (a few rows), one block per 4 weight rows, each e4m3 weight dequantized in
//    registers as f32(q) * scale_inv (the reference's f32 product), x read unrounded;
//  - quantize_fp8_groups: activations to e4m3 per token and group of 128 columns, the input of
//    cuBLASLt's block-scaled FP8 GEMM (kernels/cuda/gemm_fp8.cc) and of the grouped experts'
//    block-scaled wgmma path (kernels/cuda/moe_fp8.cu);
//  - dequantize_fp8_bf16: the weight rounded to a bf16 matrix, for the bf16 tensor-core GEMM.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fp8_convert.cuh"
#include "kernels/cuda/gemm_fp8_launch.h"

namespace loom::cuda {
namespace {

constexpr int kBlock = 128;  // columns and rows per weight scale, columns per activation scale

__device__ __forceinline__ float bf16_bits_to_f32(uint32_t bits) {
  return __uint_as_float(bits << 16);
}

using dev::e4m3_to_f32;
using dev::e4m3x2_to_f32;

// out[idx] = v (+ beta * out[idx]) in the output's element type. beta = 0 never reads out.
__device__ __forceinline__ void store_out(void* out, launch::Elem type, int64_t idx, float v,
                                          float beta) {
  if (type == launch::Elem::kF32) {
    float* o = static_cast<float*>(out) + idx;
    *o = beta == 0.0f ? v : fmaf(beta, *o, v);
  } else {
    uint16_t* o = static_cast<uint16_t*>(out) + idx;
    const float prev = beta == 0.0f ? 0.0f : bf16_bits_to_f32(*o);
    *o = __bfloat16_as_ushort(__float2bfloat16_rn(beta == 0.0f ? v : fmaf(beta, prev, v)));
  }
}

// Four activations x[0 .. 4) widened to f32 (p 16-byte aligned for f32, 8-byte for bf16).
__device__ __forceinline__ void load_x4(const float* p, float (&f)[4]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p));
  f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w;
}
__device__ __forceinline__ void load_x4(const uint16_t* p, float (&f)[4]) {
  const uint2 u = __ldg(reinterpret_cast<const uint2*>(p));
  f[0] = __uint_as_float(u.x << 16), f[1] = __uint_as_float(u.x & 0xffff0000u);
  f[2] = __uint_as_float(u.y << 16), f[3] = __uint_as_float(u.y & 0xffff0000u);
}
__device__ __forceinline__ float load_x(const float* p) { return __ldg(p); }
__device__ __forceinline__ float load_x(const uint16_t* p) { return bf16_bits_to_f32(__ldg(p)); }

// ---------------------------------------------------------------------------------------------
// GEMV: one block per kGemvRowsPerBlock weight rows, its threads striding over k together (each
// thread takes every blockDim.x-th 16-byte chunk of all the block's rows), R activation rows at
// once. Each step a thread has kGemvRowsPerBlock independent 16-byte weight loads in flight and
// reads its x chunk once for all of them; a block-wide reduction ends the row. A row's result
// depends only on k (which fixes the block size and so the partition and the reduction tree), not
// on m or n: batch-invariant.
constexpr int kGemvRowsPerBlock = 4;
constexpr int kGemvMaxThreads = 256;

// Threads per block for rows of k columns: enough 16-byte chunks for every thread (at least one
// warp, at most kGemvMaxThreads).
int gemv_threads(int64_t k) {
  const int64_t chunks = (k + 15) / 16;
  int t = 32;
  while (t < kGemvMaxThreads && t * 2 <= chunks) t *= 2;
  return t;
}

template <typename XT, int R, bool kVec>
__global__ void __launch_bounds__(kGemvMaxThreads)
    gemv_fp8_kernel(const uint8_t* __restrict__ w, const float* __restrict__ scale_inv,
                    const XT* __restrict__ x, int64_t ldx, void* __restrict__ out,
                    launch::Elem out_type, int64_t ldo, int64_t n, int64_t k, float beta) {
  constexpr int RB = kGemvRowsPerBlock;
  __shared__ float partial[kGemvMaxThreads / 32][RB * R];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * RB;
  const int64_t gk = (k + kBlock - 1) / kBlock;
  // Rows past n repeat the last row (read, never stored), so the loop needs no per-row guard.
  const uint8_t* wr[RB];
  const float* srow[RB];
#pragma unroll
  for (int b = 0; b < RB; ++b) {
    const int64_t row = row0 + b < n ? row0 + b : n - 1;
    wr[b] = w + row * k;
    srow[b] = scale_inv + (row / kBlock) * gk;
  }
  float acc[RB][R];
#pragma unroll
  for (int b = 0; b < RB; ++b) {
#pragma unroll
    for (int r = 0; r < R; ++r) acc[b][r] = 0.0f;
  }
  if constexpr (kVec) {
    // 16 weights per chunk: a 16-byte chunk never straddles two 128-column blocks.
    const int64_t k16 = k / 16;
#pragma unroll 2
    for (int64_t i = threadIdx.x; i < k16; i += blockDim.x) {
      uint4 q[RB];
      float s[RB];
#pragma unroll
      for (int b = 0; b < RB; ++b) {
        q[b] = __ldcs(reinterpret_cast<const uint4*>(wr[b]) + i);
        s[b] = __ldg(srow[b] + (i * 16) / kBlock);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        // Weights 4e .. 4e+3 of the chunk: x read 4 at a time (a 16- or 8-byte load per row).
        float xf[R][4];
#pragma unroll
        for (int r = 0; r < R; ++r) load_x4(x + r * ldx + i * 16 + 4 * e, xf[r]);
#pragma unroll
        for (int b = 0; b < RB; ++b) {
          const uint32_t word = e == 0 ? q[b].x : e == 1 ? q[b].y : e == 2 ? q[b].z : q[b].w;
          const float2 lo = e4m3x2_to_f32(word), hi = e4m3x2_to_f32(word >> 16);
          // The reference's dequantized weights: one rounded f32 product each.
          const float wv[4] = {__fmul_rn(lo.x, s[b]), __fmul_rn(lo.y, s[b]), __fmul_rn(hi.x, s[b]),
                               __fmul_rn(hi.y, s[b])};
#pragma unroll
          for (int r = 0; r < R; ++r) {
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[b][r] = fmaf(wv[j], xf[r][j], acc[b][r]);
          }
        }
      }
    }
  } else {
#pragma unroll 2
    for (int64_t c = threadIdx.x; c < k; c += blockDim.x) {
      float xv[R];
#pragma unroll
      for (int r = 0; r < R; ++r) xv[r] = load_x(x + r * ldx + c);
#pragma unroll
      for (int b = 0; b < RB; ++b) {
        const float wv = __fmul_rn(e4m3_to_f32(__ldcs(wr[b] + c)), __ldg(srow[b] + c / kBlock));
#pragma unroll
        for (int r = 0; r < R; ++r) acc[b][r] = fmaf(wv, xv[r], acc[b][r]);
      }
    }
  }
  // Block reduction: warp sums, then the first warp adds the warps' partials in order.
#pragma unroll
  for (int b = 0; b < RB; ++b) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float v = dev::warp_sum(acc[b][r]);
      if (lane == 0) partial[warp][b * R + r] = v;
    }
  }
  __syncthreads();
  const int warps = blockDim.x >> 5;
  for (int e = threadIdx.x; e < RB * R; e += blockDim.x) {
    const int b = e / R, r = e % R;
    if (row0 + b >= n) continue;
    float v = 0.0f;
    for (int u = 0; u < warps; ++u) v += partial[u][e];
    store_out(out, out_type, r * ldo + row0 + b, v, beta);
  }
}

template <typename XT, int R>
void launch_gemv(cudaStream_t stream, const uint8_t* w, const float* scale_inv, const XT* x,
                 int64_t ldx, void* out, launch::Elem out_type, int64_t ldo, int64_t n, int64_t k,
                 float beta) {
  const int64_t blocks = (n + kGemvRowsPerBlock - 1) / kGemvRowsPerBlock;
  LOOM_CHECK_GRID(blocks);
  const bool vec = k % 16 == 0 && (ldx * static_cast<int64_t>(sizeof(XT))) % 16 == 0 &&
                   (reinterpret_cast<uintptr_t>(w) & 15u) == 0 &&
                   (reinterpret_cast<uintptr_t>(x) & 15u) == 0;
  const int threads = vec ? gemv_threads(k) : gemv_threads(k * 16);
  if (vec) {
    gemv_fp8_kernel<XT, R, true><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
        w, scale_inv, x, ldx, out, out_type, ldo, n, k, beta);
  } else {
    gemv_fp8_kernel<XT, R, false><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
        w, scale_inv, x, ldx, out, out_type, ldo, n, k, beta);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

template <typename XT>
void gemv_fp8_rows(cudaStream_t stream, const uint8_t* w, const float* scale_inv, const XT* x,
                   int64_t ldx, void* out, launch::Elem out_type, int64_t ldo, int64_t m, int64_t n,
                   int64_t k, float beta) {
  switch (m) {
    case 1:
      return launch_gemv<XT, 1>(stream, w, scale_inv, x, ldx, out, out_type, ldo, n, k, beta);
    case 2:
      return launch_gemv<XT, 2>(stream, w, scale_inv, x, ldx, out, out_type, ldo, n, k, beta);
    case 3:
      return launch_gemv<XT, 3>(stream, w, scale_inv, x, ldx, out, out_type, ldo, n, k, beta);
    case 4:
      return launch_gemv<XT, 4>(stream, w, scale_inv, x, ldx, out, out_type, ldo, n, k, beta);
    case 5:
      return launch_gemv<XT, 5>(stream, w, scale_inv, x, ldx, out, out_type, ldo, n, k, beta);
    case 6:
      return launch_gemv<XT, 6>(stream, w, scale_inv, x, ldx, out, out_type, ldo, n, k, beta);
    case 7:
      return launch_gemv<XT, 7>(stream, w, scale_inv, x, ldx, out, out_type, ldo, n, k, beta);
    case 8:
      return launch_gemv<XT, 8>(stream, w, scale_inv, x, ldx, out, out_type, ldo, n, k, beta);
    default:
      std::fprintf(stderr, "%s:%d: gemv_fp8 takes 1 to %d rows, got %lld\n", __FILE__, __LINE__,
                   launch::kGemvFp8MaxRows, static_cast<long long>(m));
      std::abort();
  }
}

// ---------------------------------------------------------------------------------------------
// Activation quantization: a warp per (row, group of 128 columns), 4 columns per lane, the warps
// striding over the items (a grid of at most kQuantBlocksPerSm blocks per SM rather than a block
// per 8 items, which at a MoE prefill's millions of items means millions of tiny blocks; 1.67-1.83
// TB/s of x read and codes written at 32768 to 1M bf16 rows of 2304, moe_fp8_cuda_bench: four
// items' loads in flight a warp at fewer resident warps measured 1.2-1.3). kVec
// (k % 4 == 0, x 16-byte aligned, q 4-byte aligned): a lane's 4 values in one 16-byte (f32) or
// 8-byte (bf16) load and its 4 codes in one 4-byte store; the same operations on every value.
constexpr int kQuantWarps = 8;
constexpr int kQuantBlocksPerSm = 16;

template <typename XT, bool kVec>
__global__ void __launch_bounds__(kQuantWarps * 32)
    quantize_fp8_groups_kernel(const XT* __restrict__ x, int64_t m, int64_t k,
                               uint8_t* __restrict__ q, float* __restrict__ scales) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t groups = (k + kBlock - 1) / kBlock;
  const int64_t items = m * groups;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kQuantWarps;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * kQuantWarps + warp; item < items;
       item += stride) {  // uniform across the warp
    const int64_t r = item / groups, g = item % groups;
    const int64_t c0 = g * kBlock + lane * 4;
    const XT* xr = x + r * k;
    float v[4];
    if constexpr (kVec) {
      // k % 4 == 0: the lane's 4 columns are all in or all out.
      if (c0 < k) {
        load_x4(xr + c0, v);
      } else {
        v[0] = v[1] = v[2] = v[3] = 0.0f;
      }
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) v[e] = c0 + e < k ? load_x(xr + c0 + e) : 0.0f;
    }
    float amax = 0.0f;
#pragma unroll
    for (int e = 0; e < 4; ++e) amax = fmaxf(amax, fabsf(v[e]));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float s = amax / 448.0f;  // e4m3fn's largest finite value: the group's amax maps to it
    if (!(s > 0.0f)) s = 1.0f;
    uint8_t* qr = q + r * k;
    uint8_t codes[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      codes[e] = static_cast<uint8_t>(
          __nv_cvt_float_to_fp8(__fdiv_rn(v[e], s), __NV_SATFINITE, __NV_E4M3));
    }
    if constexpr (kVec) {
      if (c0 < k) {
        *reinterpret_cast<uint32_t*>(qr + c0) = codes[0] | (uint32_t{codes[1]} << 8) |
                                                (uint32_t{codes[2]} << 16) |
                                                (uint32_t{codes[3]} << 24);
      }
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (c0 + e < k) qr[c0 + e] = codes[e];
    }
    if (lane == 0) scales[g * m + r] = s;
  }
}

// ---------------------------------------------------------------------------------------------
// Dequantization to bf16: one thread per 16 weights (k % 16 == 0, aligned) or per weight.
constexpr int kDequantThreads = 256;

template <bool kVec>
__global__ void __launch_bounds__(kDequantThreads)
    dequantize_fp8_bf16_kernel(const uint8_t* __restrict__ w, const float* __restrict__ scale_inv,
                               int64_t n, int64_t k, uint16_t* __restrict__ out) {
  const int64_t gk = (k + kBlock - 1) / kBlock;
  const int64_t per = kVec ? 16 : 1;
  const int64_t units = n * k / per;
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * kDequantThreads + threadIdx.x; u < units;
       u += static_cast<int64_t>(gridDim.x) * kDequantThreads) {
    const int64_t e = u * per, row = e / k, col = e % k;
    const float s = __ldg(scale_inv + (row / kBlock) * gk + col / kBlock);
    if constexpr (kVec) {
      const uint4 q = __ldcs(reinterpret_cast<const uint4*>(w) + u);
      const uint32_t words[4] = {q.x, q.y, q.z, q.w};
      uint32_t packed[8];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 lo = e4m3x2_to_f32(words[j]), hi = e4m3x2_to_f32(words[j] >> 16);
        packed[2 * j] =
            __bfloat16_as_ushort(__float2bfloat16_rn(__fmul_rn(lo.x, s))) |
            (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(__fmul_rn(lo.y, s))))
             << 16);
        packed[2 * j + 1] =
            __bfloat16_as_ushort(__float2bfloat16_rn(__fmul_rn(hi.x, s))) |
            (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(__fmul_rn(hi.y, s))))
             << 16);
      }
      uint4* o = reinterpret_cast<uint4*>(out + e);
      o[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
      o[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
    } else {
      out[e] = __bfloat16_as_ushort(__float2bfloat16_rn(__fmul_rn(e4m3_to_f32(w[e]), s)));
    }
  }
}

}  // namespace

namespace launch {

void gemv_fp8(cudaStream_t stream, const uint8_t* w, const float* scale_inv, const void* x,
              Elem x_type, int64_t ldx, void* out, Elem out_type, int64_t ldo, int64_t m, int64_t n,
              int64_t k, float beta) {
  if (m == 0 || n == 0) return;
  if (x_type == Elem::kF32) {
    gemv_fp8_rows(stream, w, scale_inv, static_cast<const float*>(x), ldx, out, out_type, ldo, m, n,
                  k, beta);
  } else {
    gemv_fp8_rows(stream, w, scale_inv, static_cast<const uint16_t*>(x), ldx, out, out_type, ldo, m,
                  n, k, beta);
  }
}

void quantize_fp8_groups(cudaStream_t stream, const void* x, Elem x_type, int64_t m, int64_t k,
                         uint8_t* q, float* scales) {
  const int64_t items = m * ((k + kBlock - 1) / kBlock);
  if (items == 0) return;
  static const int sms = [] {
    int dev = 0, n = 0;
    LOOM_CUDA_CHECK(cudaGetDevice(&dev));
    LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
  }();
  const int64_t blocks =
      std::min<int64_t>((items + kQuantWarps - 1) / kQuantWarps, int64_t{sms} * kQuantBlocksPerSm);
  const bool vec = k % 4 == 0 && (reinterpret_cast<uintptr_t>(x) & 15u) == 0 &&
                   (reinterpret_cast<uintptr_t>(q) & 3u) == 0;
  const auto launch = [&](auto kernel, const auto* xt) {
    kernel<<<static_cast<unsigned>(blocks), kQuantWarps * 32, 0, stream>>>(xt, m, k, q, scales);
  };
  if (x_type == Elem::kF32) {
    const auto* xt = static_cast<const float*>(x);
    vec ? launch(quantize_fp8_groups_kernel<float, true>, xt)
        : launch(quantize_fp8_groups_kernel<float, false>, xt);
  } else {
    const auto* xt = static_cast<const uint16_t*>(x);
    vec ? launch(quantize_fp8_groups_kernel<uint16_t, true>, xt)
        : launch(quantize_fp8_groups_kernel<uint16_t, false>, xt);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

void dequantize_fp8_bf16(cudaStream_t stream, const uint8_t* w, const float* scale_inv, int64_t n,
                         int64_t k, uint16_t* out) {
  if (n * k == 0) return;
  const bool vec = k % 16 == 0 && (reinterpret_cast<uintptr_t>(w) & 15u) == 0 &&
                   (reinterpret_cast<uintptr_t>(out) & 15u) == 0;
  const unsigned blocks = dev::grid_for(vec ? n * k / 16 : n * k, kDequantThreads);
  if (vec) {
    dequantize_fp8_bf16_kernel<true>
        <<<blocks, kDequantThreads, 0, stream>>>(w, scale_inv, n, k, out);
  } else {
    dequantize_fp8_bf16_kernel<false>
        <<<blocks, kDequantThreads, 0, stream>>>(w, scale_inv, n, k, out);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace launch
}  // namespace loom::cuda
