// Loom's bf16-weight GEMM kernels (launchers in kernels/cuda/gemm_launch.h):
//  - cast_rows_f32_bf16: f32 activations to the bf16 rows the tensor-core GEMMs read;
//  - gemv_bf16: decode (a few rows), 1 to 8 warps per weight row (a split of k chosen from n
//    and k), x read unrounded;
//  - gemm_bf16_tiled: mma.sync m16n8k16 bf16 x bf16 -> f32, batch-invariant, any size and
//    alignment (the engine's --deterministic GEMM for bf16 weights, and the fallback where
//    cuBLASLt cannot take the rows).
//
// Why gemm_bf16_tiled is batch-invariant (kernels/batch_invariance.h). Output element (r, j) is
//     acc = 0; for s = 0 .. ceil(k / 16) - 1: acc = mma(x[r, 16s .. 16s+15], w[j, 16s .. 16s+15],
//     acc) out[r, j] = beta == 0 ? acc : fmaf(beta, out[r, j], acc)
// (columns past k read as zero), whatever the tile configuration: every configuration walks the
// same k16 steps in increasing order, one mma per step into the same accumulator, with no split
// of k across warps or blocks and no step past ceil(k / 16) (a stage's steps beyond it are
// skipped, so a larger BK adds no extra all-zero mma). An mma computes each element of its 16 x 8
// tile from that element's row of A, column of B and accumulator only, so neither the other rows
// of the tile (other requests, or zero padding past m) nor the row's place in it (r mod 16) changes
// the result. Which configuration runs depends on m (tile sizes, pipeline depth, how rows are
// loaded into shared memory), but none of that touches the arithmetic above: the rows of an
// m = 1 call and of an m = 300 call are bit-identical (tests/gpu/gemm_cuda_test.cc checks it).
#include <cuda_bf16.h>

#include <atomic>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm_launch.h"
#include "kernels/cuda/gemv_split.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/pdl.h"

namespace loom::cuda {
namespace {

__device__ __forceinline__ float bf16_bits_to_f32(uint32_t bits) {
  return __uint_as_float(bits << 16);
}
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float v) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}
// The eight bf16 of a 16-byte word (element 0 in the low half of .x).
__device__ __forceinline__ void unpack8(const uint4 u, float (&f)[8]) {
  f[0] = __uint_as_float(u.x << 16);
  f[1] = __uint_as_float(u.x & 0xffff0000u);
  f[2] = __uint_as_float(u.y << 16);
  f[3] = __uint_as_float(u.y & 0xffff0000u);
  f[4] = __uint_as_float(u.z << 16);
  f[5] = __uint_as_float(u.z & 0xffff0000u);
  f[6] = __uint_as_float(u.w << 16);
  f[7] = __uint_as_float(u.w & 0xffff0000u);
}

// out[idx] = v (+ beta * out[idx]) in the output's element type. beta = 0 never reads out.
__device__ __forceinline__ void store_out(void* out, launch::Elem type, int64_t idx, float v,
                                          float beta) {
  if (type == launch::Elem::kF32) {
    float* o = static_cast<float*>(out) + idx;
    *o = beta == 0.0f ? v : fmaf(beta, *o, v);
  } else {
    uint16_t* o = static_cast<uint16_t*>(out) + idx;
    *o = f32_to_bf16_bits(beta == 0.0f ? v : fmaf(beta, bf16_bits_to_f32(*o), v));
  }
}

// ---------------------------------------------------------------------------------------------
// Cast: one thread per 4 columns of a row, rows strided over gridDim.y.
constexpr int kCastThreads = 256;

template <bool kVec>
__global__ void __launch_bounds__(kCastThreads)
    cast_rows_kernel(const float* __restrict__ x, int64_t ldx, int64_t m, int64_t k,
                     uint16_t* __restrict__ xb, int64_t ldxb) {
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * kCastThreads + threadIdx.x) * 4;
  if (c >= ldxb) return;
  for (int64_t r = blockIdx.y; r < m; r += gridDim.y) {
    const float* xr = x + r * ldx;
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if constexpr (kVec) {  // k % 4 == 0 and ldx % 4 == 0: a group is all in or all out
      if (c < k) {
        const float4 f = *reinterpret_cast<const float4*>(xr + c);
        v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
      }
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) v[e] = c + e < k ? xr[c + e] : 0.0f;
    }
    uint2 p;
    p.x = f32_to_bf16_bits(v[0]) | (static_cast<uint32_t>(f32_to_bf16_bits(v[1])) << 16);
    p.y = f32_to_bf16_bits(v[2]) | (static_cast<uint32_t>(f32_to_bf16_bits(v[3])) << 16);
    *reinterpret_cast<uint2*>(xb + r * ldxb + c) = p;
  }
}

// ---------------------------------------------------------------------------------------------
// GEMV: S warps per weight row (each a slice of k; S = 1, 2, 4 or 8), R activation rows at
// once (each weight element is read once and used R times).
//
// The split of k (gemv_split.h) comes from n and k only, so a row's bits are the same in a 1-row
// and an 8-row call: lane sums in the warp_sum's fixed order, then the S partial sums in slice
// order.
constexpr int kGemvWarps = kGemvMaxSplit;

template <typename XT>
__device__ __forceinline__ float load_x(const XT* p) {
  if constexpr (sizeof(XT) == 4) {
    return __ldg(p);
  } else {
    return bf16_bits_to_f32(__ldg(p));
  }
}
template <typename XT>
__device__ __forceinline__ void load_x8(const XT* p, float (&f)[8]) {
  if constexpr (sizeof(XT) == 4) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(p));
    const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
  } else {
    unpack8(__ldg(reinterpret_cast<const uint4*>(p)), f);
  }
}

// An output's value rounded to its array's type (what a later kernel would read back).
__device__ __forceinline__ float as_stored(float v, launch::Elem type) {
  return type == launch::Elem::kF32 ? v : bf16_bits_to_f32(f32_to_bf16_bits(v));
}

// kDual (the SwiGLU GEMV): w2 is a second weight of w's shape (up beside gate), read by the same
// warp over the same slice, and the output is silu(g) * u with g and u first rounded to out's type:
// the bits of two gemv calls and silu_mul_forward, in one pass (a decode step's shared expert
// ran those as three kernels, ~5 + 5 + 2 us, ncu s19a).
//
// PDL-aware (kernels/cuda/pdl.h): rows below prefetch_rows are pulled into L2 (one bulk prefetch
// of each weight's row by the row's first lane) before the wait, which precedes every read of x
// or out and every store.
template <typename XT, int R, bool kVec, int S, bool kDual = false>
__global__ void __launch_bounds__(kGemvWarps * 32)
    gemv_bf16_kernel(const uint16_t* __restrict__ w, const XT* __restrict__ x, int64_t ldx,
                     void* __restrict__ out, launch::Elem out_type, int64_t ldo, int64_t n,
                     int64_t k, float beta, int64_t prefetch_rows,
                     const uint16_t* __restrict__ w2 = nullptr) {
  static_assert(kGemvWarps % S == 0);
  constexpr int NM = kDual ? 2 : 1;  // weight matrices
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int part = warp % S;  // this warp's slice of k
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kGemvWarps / S) + warp / S;
  const bool live = row < n;  // uniform across the warp
  if constexpr (kVec) {       // rows of 16-byte multiples, 16-byte aligned
    if (row < prefetch_rows && part == 0 && lane == 0) {
      const auto bytes = static_cast<uint32_t>(k * 2);
      dev::prefetch_l2(w + row * k, bytes);
      if constexpr (kDual) dev::prefetch_l2(w2 + row * k, bytes);
    }
  }
  dev::pdl_wait();
  float acc[NM][R];
#pragma unroll
  for (int m = 0; m < NM; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[m][r] = 0.0f;
  if (live) {
    const uint16_t* wr[NM];
    wr[0] = w + row * k;
    if constexpr (kDual) wr[1] = w2 + row * k;
    if constexpr (kVec) {
      const int64_t k8 = k / 8;
#pragma unroll 4
      for (int64_t i = part * 32 + lane; i < k8; i += 32 * S) {
        float wf[NM][8];
#pragma unroll
        for (int m = 0; m < NM; ++m)
          unpack8(__ldcs(reinterpret_cast<const uint4*>(wr[m]) + i), wf[m]);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float xf[8];
          load_x8(x + r * ldx + i * 8, xf);
#pragma unroll
          for (int m = 0; m < NM; ++m)
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[m][r] = fmaf(wf[m][e], xf[e], acc[m][r]);
        }
      }
    } else {
#pragma unroll 4
      for (int64_t i = part * 32 + lane; i < k; i += 32 * S) {
        float wv[NM];
#pragma unroll
        for (int m = 0; m < NM; ++m) wv[m] = bf16_bits_to_f32(__ldcs(wr[m] + i));
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const float xv = load_x(x + r * ldx + i);
#pragma unroll
          for (int m = 0; m < NM; ++m) acc[m][r] = fmaf(wv[m], xv, acc[m][r]);
        }
      }
    }
  }
  // The row's sums: lane r ends with row r's (each matrix's) in mine[].
  float mine[NM];
#pragma unroll
  for (int m = 0; m < NM; ++m) mine[m] = 0.0f;
  bool writer;
  if constexpr (S == 1) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int m = 0; m < NM; ++m) {
        const float s = dev::warp_sum(acc[m][r]);
        if (lane == r) mine[m] = s;
      }
    }
    writer = live && lane < R;
  } else {
    __shared__ float partial[NM][kGemvWarps][R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int m = 0; m < NM; ++m) {
        const float s = dev::warp_sum(acc[m][r]);
        if (lane == r) partial[m][warp][r] = s;
      }
    }
    __syncthreads();
    writer = live && part == 0 && lane < R;
    if (writer) {
#pragma unroll
      for (int m = 0; m < NM; ++m) {
        float s = partial[m][warp][lane];
#pragma unroll
        for (int j = 1; j < S; ++j) s += partial[m][warp + j][lane];
        mine[m] = s;
      }
    }
  }
  if (writer) {
    if constexpr (kDual) {
      const float g = as_stored(mine[0], out_type), u = as_stored(mine[1], out_type);
      store_out(out, out_type, lane * ldo + row, dev::silu(g) * u, 0.0f);
    } else {
      store_out(out, out_type, lane * ldo + row, mine[0], beta);
    }
  }
}

template <typename XT, int R, int S, bool kDual = false>
void launch_gemv_split(cudaStream_t stream, bool vec, const uint16_t* w, const XT* x, int64_t ldx,
                       void* out, launch::Elem out_type, int64_t ldo, int64_t n, int64_t k,
                       float beta, const uint16_t* w2 = nullptr) {
  const int64_t rows_per_block = kGemvWarps / S;
  const int64_t blocks = (n + rows_per_block - 1) / rows_per_block;
  LOOM_CHECK_GRID(blocks);
  if (vec) {
    constexpr auto kernel = gemv_bf16_kernel<XT, R, true, S, kDual>;
    static const bool marked = (mark_pdl_kernel(reinterpret_cast<const void*>(kernel)), true);
    (void)marked;
    const int64_t prefetch = pdl_prefetch_rows(n, k * 2 * (kDual ? 2 : 1));
    kernel<<<static_cast<unsigned>(blocks), kGemvWarps * 32, 0, stream>>>(
        w, x, ldx, out, out_type, ldo, n, k, beta, prefetch, w2);
  } else {
    constexpr auto kernel = gemv_bf16_kernel<XT, R, false, S, kDual>;
    static const bool marked = (mark_pdl_kernel(reinterpret_cast<const void*>(kernel)), true);
    (void)marked;
    kernel<<<static_cast<unsigned>(blocks), kGemvWarps * 32, 0, stream>>>(w, x, ldx, out, out_type,
                                                                          ldo, n, k, beta, 0, w2);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

template <typename XT, int R, bool kDual>
void launch_gemv(cudaStream_t stream, const uint16_t* w, const uint16_t* w2, const XT* x,
                 int64_t ldx, void* out, launch::Elem out_type, int64_t ldo, int64_t n, int64_t k,
                 float beta) {
  const bool vec = k % 8 == 0 && ldx % 8 == 0 && (reinterpret_cast<uintptr_t>(w) & 15u) == 0 &&
                   (!kDual || (reinterpret_cast<uintptr_t>(w2) & 15u) == 0) &&
                   (reinterpret_cast<uintptr_t>(x) & 15u) == 0;
  switch (gemv_split(n, k)) {
    case 1:
      return launch_gemv_split<XT, R, 1, kDual>(stream, vec, w, x, ldx, out, out_type, ldo, n, k,
                                                beta, w2);
    case 2:
      return launch_gemv_split<XT, R, 2, kDual>(stream, vec, w, x, ldx, out, out_type, ldo, n, k,
                                                beta, w2);
    case 4:
      return launch_gemv_split<XT, R, 4, kDual>(stream, vec, w, x, ldx, out, out_type, ldo, n, k,
                                                beta, w2);
    default:
      return launch_gemv_split<XT, R, 8, kDual>(stream, vec, w, x, ldx, out, out_type, ldo, n, k,
                                                beta, w2);
  }
}

template <typename XT, bool kDual>
void gemv_bf16_rows(cudaStream_t stream, const uint16_t* w, const uint16_t* w2, const XT* x,
                    int64_t ldx, void* out, launch::Elem out_type, int64_t ldo, int64_t m,
                    int64_t n, int64_t k, float beta) {
  switch (m) {
    case 1:
      return launch_gemv<XT, 1, kDual>(stream, w, w2, x, ldx, out, out_type, ldo, n, k, beta);
    case 2:
      return launch_gemv<XT, 2, kDual>(stream, w, w2, x, ldx, out, out_type, ldo, n, k, beta);
    case 3:
      return launch_gemv<XT, 3, kDual>(stream, w, w2, x, ldx, out, out_type, ldo, n, k, beta);
    case 4:
      return launch_gemv<XT, 4, kDual>(stream, w, w2, x, ldx, out, out_type, ldo, n, k, beta);
    case 5:
      return launch_gemv<XT, 5, kDual>(stream, w, w2, x, ldx, out, out_type, ldo, n, k, beta);
    case 6:
      return launch_gemv<XT, 6, kDual>(stream, w, w2, x, ldx, out, out_type, ldo, n, k, beta);
    case 7:
      return launch_gemv<XT, 7, kDual>(stream, w, w2, x, ldx, out, out_type, ldo, n, k, beta);
    case 8:
      return launch_gemv<XT, 8, kDual>(stream, w, w2, x, ldx, out, out_type, ldo, n, k, beta);
    default:
      std::fprintf(stderr, "%s:%d: gemv_bf16 takes 1 to %d rows, got %lld\n", __FILE__, __LINE__,
                   launch::kGemvBf16MaxRows, static_cast<long long>(m));
      std::abort();
  }
}

// ---------------------------------------------------------------------------------------------
// Tiled tensor-core GEMM. A block computes a BM x BN tile of out with WM x WN warps (each a
// (BM / WM) x (BN / WN) tile of m16n8 mma tiles); k advances BK columns per pipeline stage,
// STAGES stages in flight (cp.async, 16 bytes per copy; element loads where rows are not
// 16-byte aligned). Shared rows are BK + 8 bf16 long: 16-byte aligned for ldmatrix, and the 8
// rows an ldmatrix reads fall in distinct banks.

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes from src to shared dst, or 16 zero bytes when !valid (src is then not read).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}
// d += a (16 x 16, row) * b (16 x 8, col), bf16 inputs, f32 accumulators.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <int BM, int BN, int BK, int WM, int WN, int STAGES>
struct TileConfig {
  static constexpr int kThreads = WM * WN * 32;
  static constexpr int kLds = BK + 8;  // shared row stride, bf16 elements
  static constexpr int kStageElems = (BM + BN) * kLds;
  static constexpr int kSmemBytes = STAGES * kStageElems * 2;
  static constexpr int kWarpM = BM / WM, kWarpN = BN / WN;
  static constexpr int kMi = kWarpM / 16, kNi = kWarpN / 8;
  static_assert(kWarpM % 16 == 0 && kWarpN % 8 == 0 && (kNi == 1 || kNi % 2 == 0));
  static_assert(BK % 16 == 0 && STAGES >= 2);
};

// `rows` rows of a bf16 matrix (row stride ld, rows_total rows, k columns) from row row0 and
// column k0 into shared dst (stride kLds); rows past rows_total and columns past k read as 0.
// vec: 16-byte copies (ld % 8 == 0, 16-byte aligned base, and columns k .. round_up(k, 8) - 1
// zero or absent, so a copy that starts before k may cover them).
template <int kRows, int BK, int kLds, int kThreads>
__device__ __forceinline__ void load_tile(uint16_t* dst, const uint16_t* __restrict__ src,
                                          int64_t ld, int64_t row0, int64_t rows_total, int64_t k0,
                                          int64_t k, bool vec) {
  const int tid = threadIdx.x;
  if (vec) {
    constexpr int kChunks = BK / 8;
#pragma unroll 4
    for (int c = tid; c < kRows * kChunks; c += kThreads) {
      const int r = c / kChunks, kc = (c % kChunks) * 8;
      const int64_t gr = row0 + r, gk = k0 + kc;
      const bool ok = gr < rows_total && gk < k;
      cp_async16(smem_addr(dst + r * kLds + kc), ok ? src + gr * ld + gk : src, ok);
    }
  } else {
    for (int e = tid; e < kRows * BK; e += kThreads) {
      const int r = e / BK, kc = e % BK;
      const int64_t gr = row0 + r, gk = k0 + kc;
      dst[r * kLds + kc] = gr < rows_total && gk < k ? src[gr * ld + gk] : uint16_t{0};
    }
  }
}

template <int BM, int BN, int BK, int WM, int WN, int STAGES>
__global__ void __launch_bounds__(WM* WN * 32)
    gemm_bf16_tiled_kernel(const uint16_t* __restrict__ x, int64_t ldx,
                           const uint16_t* __restrict__ w, void* __restrict__ out,
                           launch::Elem out_type, int64_t m, int64_t n, int64_t k, float beta,
                           bool x_vec, bool w_vec) {
  using C = TileConfig<BM, BN, BK, WM, WN, STAGES>;
  constexpr int kLds = C::kLds, kMi = C::kMi, kNi = C::kNi;
  extern __shared__ __align__(16) uint16_t smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wm = warp / WN, wn = warp % WN;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * BM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * BN;
  const int64_t k_tiles = (k + BK - 1) / BK;
  const int64_t k_steps = (k + 15) / 16;  // the mma steps of every output element

  auto load_stage = [&](int stage, int64_t kt) {
    uint16_t* xs = smem + stage * C::kStageElems;
    load_tile<BM, BK, kLds, C::kThreads>(xs, x, ldx, m0, m, kt * BK, k, x_vec);
    load_tile<BN, BK, kLds, C::kThreads>(xs + BM * kLds, w, k, n0, n, kt * BK, k, w_vec);
  };

  float acc[kMi][kNi][4];
#pragma unroll
  for (int i = 0; i < kMi; ++i) {
#pragma unroll
    for (int j = 0; j < kNi; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;
  }

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    cp_async_commit();
  }
  for (int64_t kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // stage kt landed for every thread; stage kt - 1 is free
    const int64_t next = kt + STAGES - 1;
    if (next < k_tiles) load_stage(static_cast<int>(next % STAGES), next);
    cp_async_commit();

    const uint16_t* xs = smem + static_cast<int>(kt % STAGES) * C::kStageElems;
    const uint16_t* ws = xs + BM * kLds;
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      if (kt * (BK / 16) + kk >= k_steps) break;  // uniform: no mma past ceil(k / 16)
      uint32_t a[kMi][4];
#pragma unroll
      for (int i = 0; i < kMi; ++i) {
        const int row = wm * C::kWarpM + i * 16 + (lane & 15);
        ldmatrix_x4(a[i], smem_addr(xs + row * kLds + kk * 16 + (lane >> 4) * 8));
      }
      uint32_t b[kNi][2];
      if constexpr (kNi == 1) {
        const int row = wn * C::kWarpN + (lane & 7);
        ldmatrix_x2(b[0], smem_addr(ws + row * kLds + kk * 16 + ((lane >> 3) & 1) * 8));
      } else {
#pragma unroll
        for (int j2 = 0; j2 < kNi / 2; ++j2) {
          const int row = wn * C::kWarpN + j2 * 16 + (lane & 7) + ((lane >> 4) << 3);
          uint32_t r[4];
          ldmatrix_x4(r, smem_addr(ws + row * kLds + kk * 16 + ((lane >> 3) & 1) * 8));
          b[2 * j2][0] = r[0], b[2 * j2][1] = r[1];
          b[2 * j2 + 1][0] = r[2], b[2 * j2 + 1][1] = r[3];
        }
      }
#pragma unroll
      for (int i = 0; i < kMi; ++i) {
#pragma unroll
        for (int j = 0; j < kNi; ++j) mma_bf16_16816(acc[i][j], a[i], b[j][0], b[j][1]);
      }
    }
  }
  cp_async_wait<0>();  // no copy may outlive the block

  // Accumulator c of an m16n8 tile: row lane / 4 (+ 8 for c2, c3), columns 2 (lane % 4) + {0, 1}.
#pragma unroll
  for (int i = 0; i < kMi; ++i) {
#pragma unroll
    for (int j = 0; j < kNi; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t r = m0 + wm * C::kWarpM + i * 16 + (lane >> 2) + h * 8;
        if (r >= m) continue;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int64_t c = n0 + wn * C::kWarpN + j * 8 + (lane & 3) * 2 + e;
          if (c < n) store_out(out, out_type, r * n + c, acc[i][j][h * 2 + e], beta);
        }
      }
    }
  }
}

template <int BM, int BN, int BK, int WM, int WN, int STAGES>
void launch_tiled(cudaStream_t stream, const uint16_t* x, int64_t ldx, const uint16_t* w, void* out,
                  launch::Elem out_type, int64_t m, int64_t n, int64_t k, float beta) {
  using C = TileConfig<BM, BN, BK, WM, WN, STAGES>;
  auto* kernel = gemm_bf16_tiled_kernel<BM, BN, BK, WM, WN, STAGES>;
  if constexpr (C::kSmemBytes > 48 * 1024) {
    // The opt-in to more than 48 KiB of dynamic shared memory is per device: once each.
    static std::atomic<uint64_t> done{0};
    int device = 0;
    LOOM_CUDA_CHECK(cudaGetDevice(&device));
    const uint64_t bit = uint64_t{1} << (device & 63);
    if ((done.load(std::memory_order_acquire) & bit) == 0) {
      LOOM_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes));
      done.fetch_or(bit, std::memory_order_acq_rel);
    }
  }
  const int64_t gx = (n + BN - 1) / BN, gy = (m + BM - 1) / BM;
  LOOM_CHECK_GRID(gx);
  if (gy > 65535) {
    std::fprintf(stderr, "%s:%d: gemm_bf16_tiled: %lld rows exceed the grid (at most %d)\n",
                 __FILE__, __LINE__, static_cast<long long>(m), 65535 * BM);
    std::abort();
  }
  const bool x_vec = ldx % 8 == 0 && (reinterpret_cast<uintptr_t>(x) & 15u) == 0;
  const bool w_vec = k % 8 == 0 && (reinterpret_cast<uintptr_t>(w) & 15u) == 0;
  kernel<<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), C::kThreads, C::kSmemBytes,
           stream>>>(x, ldx, w, out, out_type, m, n, k, beta, x_vec, w_vec);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace

namespace launch {

void cast_rows_f32_bf16(cudaStream_t stream, const float* x, int64_t ldx, int64_t m, int64_t k,
                        uint16_t* xb, int64_t ldxb) {
  if (m == 0 || ldxb == 0) return;
  const int64_t groups = (ldxb + 3) / 4;
  const int64_t gx = (groups + kCastThreads - 1) / kCastThreads;
  LOOM_CHECK_GRID(gx);
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(m < 65535 ? m : 65535));
  if (k % 4 == 0 && ldx % 4 == 0 && (reinterpret_cast<uintptr_t>(x) & 15u) == 0) {
    cast_rows_kernel<true><<<grid, kCastThreads, 0, stream>>>(x, ldx, m, k, xb, ldxb);
  } else {
    cast_rows_kernel<false><<<grid, kCastThreads, 0, stream>>>(x, ldx, m, k, xb, ldxb);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

void gemv_bf16(cudaStream_t stream, const uint16_t* w, const void* x, Elem x_type, int64_t ldx,
               void* out, Elem out_type, int64_t ldo, int64_t m, int64_t n, int64_t k, float beta) {
  if (m == 0 || n == 0) return;
  if (x_type == Elem::kF32) {
    gemv_bf16_rows<float, false>(stream, w, nullptr, static_cast<const float*>(x), ldx, out,
                                 out_type, ldo, m, n, k, beta);
  } else {
    gemv_bf16_rows<uint16_t, false>(stream, w, nullptr, static_cast<const uint16_t*>(x), ldx, out,
                                    out_type, ldo, m, n, k, beta);
  }
}

void gemv_bf16_swiglu(cudaStream_t stream, const uint16_t* w_gate, const uint16_t* w_up,
                      const void* x, Elem x_type, int64_t ldx, void* h, Elem h_type, int64_t ldh,
                      int64_t m, int64_t n, int64_t k) {
  if (m == 0 || n == 0) return;
  if (x_type == Elem::kF32) {
    gemv_bf16_rows<float, true>(stream, w_gate, w_up, static_cast<const float*>(x), ldx, h, h_type,
                                ldh, m, n, k, 0.0f);
  } else {
    gemv_bf16_rows<uint16_t, true>(stream, w_gate, w_up, static_cast<const uint16_t*>(x), ldx, h,
                                   h_type, ldh, m, n, k, 0.0f);
  }
}

void gemm_bf16_tiled(cudaStream_t stream, const uint16_t* x, int64_t ldx, const uint16_t* w,
                     void* out, Elem out_type, int64_t m, int64_t n, int64_t k, float beta) {
  if (m == 0 || n == 0) return;
  // Tile sizes by m (the arithmetic of an element is the same in all three; see the top):
  // decode-sized m streams w through a deep pipeline of 256-column stages in many small blocks;
  // larger m reuses each w tile over more rows.
  if (m <= 16) {
    launch_tiled<16, 16, 256, 1, 2, 6>(stream, x, ldx, w, out, out_type, m, n, k, beta);
  } else if (m <= 128) {
    launch_tiled<64, 32, 64, 2, 2, 4>(stream, x, ldx, w, out, out_type, m, n, k, beta);
  } else {
    launch_tiled<128, 128, 32, 2, 4, 4>(stream, x, ldx, w, out, out_type, m, n, k, beta);
  }
}

}  // namespace launch
}  // namespace loom::cuda
