// Varlen KDA / Gated DeltaNet on CUDA: the chunked (WY/UT) prefill on tensor cores, and the token
// recurrence for short sequences and batch-invariant numerics.
//
// Chunked form (the maths of kernels/cpu/kda.cc, per value head and chunk of L <= 64 tokens with
// incoming state S0 [dk, dv]; gc_t = sum_{u <= t} g_u inside the chunk):
//   A_ts  = beta_t sum_c k_tc k_sc exp(gc_tc - gc_sc)      (s < t)
//   P_ts  = sum_c q_tc k_sc exp(gc_tc - gc_sc)              (s <= t; q scaled)
//   TB    = (I + A)^-1 diag(beta)
//   W     = TB (k exp(gc)),  U0 = TB v,  U = U0 - W S0
//   O     = (q exp(gc)) S0 + P U
//   S_L   = diag(exp(gc_L)) S0 + (k exp(gc_L - gc))^T U
// Three launches:
//  1. kda_chunk_table_kernel: per sequence, the index of its first chunk (a block-wide scan over
//     the sequences on the device; cu_seqlens never goes to the host).
//  2. kda_prep_kernel, one block per (chunk, value head), all chunks in parallel: everything that
//     does not depend on the state. Writes QG = scale q exp(gc), KG = k exp(gc_L - gc), P, W,
//     U0 and exp(gc_L) for the chunk to a workspace.
//  3. kda_state_kernel, one block per (sequence, value head, tile of BV value columns): the
//     sequential pass over the sequence's chunks with the state tile in registers. Per chunk:
//     v_new = U0 - W S, O = QG S + P v_new, S = decay S + KG^T v_new; the next chunk's operands
//     stream into shared memory (cp.async) while this one computes.
// Head sizes: dk and dv are padded with zeros to one D in {32, 64, 128} (template parameter).
// Numerics: like the CPU twin, nothing of the form exp(-gc) over a chunk is formed. gc is kept as
// a base per 16-token sub-chunk (gb_i = gc at its first token, in double) plus the local cumsum
// gl_t = gc_t - gb_i (f32, |gl| <= 75 for bounded gates). Per sub-chunk i and channel, a few
// factors are formed once from the doubles (accurate expf): e^{gb_i}, e^{gc_L - gc_{e_i}} (e_i its
// last row), e^{-gl_{e_i}} and, for j < i, e^{gc_{16i} - gc_{e_j}}; per element only
// e^{gl_t} and f_t = e^{gl_{e_i} - gl_t} (both <= 1) are evaluated. Then q e^{gc} = (q e^{gl})
// e^{gb}, k e^{gc_L - gc} = (k f) e^{gc_L - gc_e}, and P and A are built in 16x16 blocks (i, j) as
// (x_t e^{gl_t}) . (k_s f_s) E_ij with E_ij = e^{gc_{16i} - gc_{e_j}} <= 1 for j < i; on the
// diagonal E_ii = e^{-gl_{e_i}} is up to e^80, used only when the sub-chunk's decay span is at most
// 80 nats in every channel (always, for bounded gates g >= -5); otherwise the diagonal block is
// summed element by element with exp(gl_t - gl_s) <= 1.
// Tensor cores: mma.sync m16n8k16 bf16 with f32 accumulation for bf16 inputs; f32 inputs run the
// same kernels with f32 operands and CUDA-core FMAs in the same fragment layout (conformance).
// The state is f32 throughout; its bf16 copy is only an mma operand.
#include <cuda_bf16.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kda_chunked_launch.h"

namespace loom::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kC = 64;         // chunk
constexpr int kSub = 16;       // sub-chunk
constexpr int kThreads = 256;  // 8 warps: the state pass
// The per-chunk preparation: 16 warps, two blocks per multiprocessor (shared memory allows two;
// the registers, at most 64 a thread then, four warps per scheduler).
constexpr int kPrepThreads = 512, kPrepWarps = kPrepThreads / 32;
constexpr float kMaxFactorSpan = 80.0f;

__device__ __forceinline__ int64_t imin64(int64_t a, int64_t b) { return a < b ? a : b; }

// ---- scalar helpers ----------------------------------------------------------------------------

__device__ __forceinline__ float ld_f(const float* p) { return *p; }
__device__ __forceinline__ float ld_f(const bf16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void st_f(float* p, float x) { *p = x; }
__device__ __forceinline__ void st_f(bf16* p, float x) { *p = __float2bfloat16_rn(x); }
__device__ __forceinline__ void st2(float* p, float a, float b) {
  *reinterpret_cast<float2*>(p) = make_float2(a, b);
}
__device__ __forceinline__ void st2(bf16* p, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
}
__device__ __forceinline__ float ld_beta(const void* p, int64_t i, bool bf) {
  return bf ? __bfloat162float(static_cast<const bf16*>(p)[i]) : static_cast<const float*>(p)[i];
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// ---- async copies ------------------------------------------------------------------------------

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_size = valid ? 16 : 0;  // 0: zero-fill, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(src_size)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// 64 rows of a tile with bounds (rows >= rows_valid, 16-byte pieces at columns >= cols_valid are
// zero-filled), the loop unrolled over a compile-time count.
template <class E, int COLS, int LDS, int THREADS>
__device__ __forceinline__ void tile_async_rows(E* smem, const E* src, int64_t gstride,
                                                int rows_valid, int cols_valid) {
  constexpr int kPer = 16 / static_cast<int>(sizeof(E));
  constexpr int kPieces = COLS / kPer;
  static_assert(THREADS % kPieces == 0, "pieces of a row divide the block");
  constexpr int kRowStep = THREADS / kPieces;
  const int r0 = static_cast<int>(threadIdx.x) / kPieces;
  const int p = static_cast<int>(threadIdx.x) % kPieces;
  const bool col_ok = p * kPer < cols_valid;
#pragma unroll
  for (int k = 0; k < (64 + kRowStep - 1) / kRowStep; ++k) {
    const int r = r0 + k * kRowStep;
    if (kRowStep * (k + 1) <= 64 || r < 64) {
      const bool ok = col_ok && r < rows_valid;
      cp_async16(smem + r * LDS + p * kPer, ok ? src + r * gstride + p * kPer : src, ok);
    }
  }
}

// A whole 64-row tile (no bounds), every size a compile-time constant: the offsets fold into the
// instructions (the state pass issues ~16 of these copies a thread per chunk).
// LOWER: only the 16-column blocks on or below the diagonal of a 64 x 64 tile (the rest of the
// shared tile must hold zeros already).
template <class E, int COLS, int LDS, int GSTRIDE, bool LOWER = false>
__device__ __forceinline__ void tile_async_full(E* smem, const E* src) {
  constexpr int kPer = 16 / static_cast<int>(sizeof(E));
  constexpr int kPieces = COLS / kPer;
  static_assert(kThreads % kPieces == 0, "pieces of a row divide the block");
  constexpr int kRowStep = kThreads / kPieces;
  const int r0 = static_cast<int>(threadIdx.x) / kPieces;
  const int p = static_cast<int>(threadIdx.x) % kPieces;
  E* d = smem + r0 * LDS + p * kPer;
  const E* g = src + r0 * GSTRIDE + p * kPer;
#pragma unroll
  for (int r = 0; r < 64; r += kRowStep) {
    const bool lower_ok = !LOWER || p < (kPieces / 4) * ((r0 + r) / 16 + 1);
    if ((kRowStep <= 64 || r0 < 64) && lower_ok) cp_async16(d + r * LDS, g + r * GSTRIDE, true);
  }
}

// ---- warp-level GEMM on one m16 row tile -------------------------------------------------------
// acc[nt] (the m16 x n8 accumulator tile at rows m0.., columns n0 + 8 nt..) += A[m0.., 0..K) B,
// B row-major [K][n] in shared memory; A row-major (A[m * lda + k]) or, with AT, stored
// transposed (A[k * lda + m]). Accumulator layout (mma.sync m16n8k16): lane = 4 g + q holds
// rows g and g + 8, columns 2q and 2q + 1: acc[nt][r] is (g + 8 (r >> 1), 2q + (r & 1)).

__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void ldsm4(uint32_t (&r)[4], const void* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}
__device__ __forceinline__ void ldsm4t(uint32_t (&r)[4], const void* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}
__device__ __forceinline__ void ldsm2t(uint32_t (&r)[2], const void* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(a)
               : "memory");
}

// A fragment (m16 x k16 at m0, k0). ldmatrix.x4 matrices in a0..a3 order: (m 0-7, k 0-7),
// (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15); lanes 8i..8i+7 address matrix i's rows.
template <bool AT>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* A, int lda, int m0, int k0) {
  const int lane = threadIdx.x & 31;
  if constexpr (!AT) {
    ldsm4(a, A + (m0 + (lane & 15)) * lda + k0 + (lane >> 4) * 8);
  } else {  // stored rows are k: transpose each 8x8 matrix on load
    ldsm4t(a, A + (k0 + (lane & 7) + (lane >> 4) * 8) * lda + m0 + ((lane >> 3) & 1) * 8);
  }
}

// One k16 step: acc += A[m0.., k0..k0+16) B[k0..k0+16, n0..).
template <int NT, bool AT>
__device__ __forceinline__ void mma_kstep(float (&acc)[NT][4], const bf16* A, int lda, int m0,
                                          const bf16* B, int ldb, int n0, int k0) {
  const int lane = threadIdx.x & 31;
  // B row-major [k][n]: ldmatrix.trans gives b0b1 = (k 2q, 2q+1; n g); matrices (k 0-7, n 0-7),
  // (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15).
  const int brow = (lane & 7) + ((lane >> 3) & 1) * 8;
  uint32_t a[4];
  load_a<AT>(a, A, lda, m0, k0);
  const bf16* Bk = B + (k0 + brow) * ldb + n0;
#pragma unroll
  for (int np = 0; np < NT / 2; ++np) {
    uint32_t b[4];
    ldsm4t(b, Bk + np * 16 + (lane >> 4) * 8);
    mma16816(acc[2 * np], a, b[0], b[1]);
    mma16816(acc[2 * np + 1], a, b[2], b[3]);
  }
  if constexpr (NT % 2 == 1) {
    uint32_t b[2];
    ldsm2t(b, Bk + (NT - 1) * 8);
    mma16816(acc[NT - 1], a, b[0], b[1]);
  }
}

// The f32 twin: same tiles and accumulator layout, CUDA-core FMAs.
template <int NT, bool AT>
__device__ __forceinline__ void mma_kstep(float (&acc)[NT][4], const float* A, int lda, int m0,
                                          const float* B, int ldb, int n0, int k0) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
#pragma unroll 4
  for (int k = k0; k < k0 + 16; ++k) {
    const float alo = AT ? A[k * lda + m0 + g] : A[(m0 + g) * lda + k];
    const float ahi = AT ? A[k * lda + m0 + g + 8] : A[(m0 + g + 8) * lda + k];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const float2 b = *reinterpret_cast<const float2*>(B + k * ldb + n0 + 8 * nt + 2 * q);
      acc[nt][0] = fmaf(alo, b.x, acc[nt][0]);
      acc[nt][1] = fmaf(alo, b.y, acc[nt][1]);
      acc[nt][2] = fmaf(ahi, b.x, acc[nt][2]);
      acc[nt][3] = fmaf(ahi, b.y, acc[nt][3]);
    }
  }
}

template <int NT>
__device__ __forceinline__ void zero_acc(float (&acc)[NT][4]) {
#pragma unroll
  for (int i = 0; i < NT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
}

template <int NT, bool AT, class T>
__device__ __forceinline__ void warp_mma(float (&acc)[NT][4], const T* A, int lda, int m0,
                                         const T* B, int ldb, int n0, int K) {
  for (int k0 = 0; k0 < K; k0 += 16) mma_kstep<NT, AT>(acc, A, lda, m0, B, ldb, n0, k0);
}

// The same product with even and odd k steps in two accumulator sets (half the dependent chain
// of mma instructions), summed at the end. K a multiple of 32.
template <int NT, bool AT, class T>
__device__ __forceinline__ void warp_mma_split(float (&acc)[NT][4], const T* A, int lda, int m0,
                                               const T* B, int ldb, int n0, int K) {
  float odd[NT][4];
  zero_acc(odd);
#pragma unroll
  for (int k0 = 0; k0 < K; k0 += 32) {
    mma_kstep<NT, AT>(acc, A, lda, m0, B, ldb, n0, k0);
    mma_kstep<NT, AT>(odd, A, lda, m0, B, ldb, n0, k0 + 16);
  }
#pragma unroll
  for (int i = 0; i < NT; ++i) {
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[i][r] += odd[i][r];
  }
}

__device__ __forceinline__ float2 ld2(const float* p) {
  return *reinterpret_cast<const float2*>(p);
}
__device__ __forceinline__ float2 ld2(const bf16* p) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}
// Four consecutive elements (16-byte aligned f32, 8-byte aligned bf16).
__device__ __forceinline__ float4 ld4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}
__device__ __forceinline__ float4 ld4(const bf16* p) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
  return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ void st4(float* p, float a, float b, float c, float d) {
  *reinterpret_cast<float4*>(p) = make_float4(a, b, c, d);
}
__device__ __forceinline__ void st4(bf16* p, float a, float b, float c, float d) {
  uint2 u;
  u.x = pack_bf16(a, b);
  u.y = pack_bf16(c, d);
  *reinterpret_cast<uint2*>(p) = u;
}

template <class E>
constexpr int kPad = 16 / static_cast<int>(sizeof(E));  // one 16-byte piece per row

// ---- 1. chunk table ----------------------------------------------------------------------------

// off[b] = number of chunks of the sequences before b that run chunked (length > rmax);
// off[B] = the total. One block of 1024 threads.
__global__ void __launch_bounds__(1024)
    kda_chunk_table_kernel(const int64_t* __restrict__ cu, int64_t B, int64_t rmax,
                           int32_t* __restrict__ off) {
  __shared__ int32_t part[1024];
  const int t = threadIdx.x;
  const int64_t per = (B + 1023) / 1024;
  const int64_t b0 = imin64(B, t * per), b1 = imin64(B, b0 + per);
  auto chunks = [&](int64_t b) {
    const int64_t len = cu[b + 1] - cu[b];
    return len > rmax ? static_cast<int32_t>((len + kC - 1) / kC) : 0;
  };
  int32_t s = 0;
  for (int64_t b = b0; b < b1; ++b) s += chunks(b);
  part[t] = s;
  __syncthreads();
  for (int o = 1; o < 1024; o <<= 1) {
    const int32_t x = t >= o ? part[t - o] : 0;
    __syncthreads();
    part[t] += x;
    __syncthreads();
  }
  int32_t run = part[t] - s;
  for (int64_t b = b0; b < b1; ++b) {
    off[b] = run;
    run += chunks(b);
  }
  if (t == 1023) off[B] = part[1023];
}

// The sequence of global chunk ci: off[b] <= ci < off[b + 1] (ci < off[B]).
__device__ __forceinline__ int64_t chunk_sequence(const int32_t* off, int64_t B, int32_t ci) {
  int64_t lo = 0, hi = B;
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (off[mid] <= ci) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Workspace of one (chunk, value head): W, QG, KG [64][D], P [64][64], U0 [64][D] (E),
// exp(gc_L) [D] (f32).
template <class E, int D>
struct Work {
  static constexpr size_t kW = 0, kQG = 64 * D, kKG = 2 * 64 * D, kP = 3 * 64 * D,
                          kU = kP + 64 * 64, kElems = kU + 64 * D;
  static constexpr size_t kDecayByte = kElems * sizeof(E);
  static constexpr size_t kBytes = (kDecayByte + D * sizeof(float) + 255) / 256 * 256;
};

struct Args {
  const void *q, *k, *v;
  const float* g;
  const void* beta;
  void* out;
  float* pool;
  const int32_t* slots;
  const int64_t* cu;
  const int32_t* off;
  unsigned char* work;
  float* state_before;  // null, or [chunks, Hv, dk, dv]: the state before each chunk
  float scale;
  int64_t B, num_slots, rmax;
  int Hk, Hv, dk, dv, ntiles;
  bool scalar_g, beta_bf16;
};

// ---- 2. per-chunk preparation ------------------------------------------------------------------

template <class E, int DK>
struct PrepLayout {
  static constexpr int P = kPad<E>;
  static constexpr int LDK = DK + P;  // E rows: k, QN, KN, X
  static constexpr int LDG = DK;      // f32 rows: gl
  static constexpr int LDA = 68;      // f32 rows: A, T
  static constexpr size_t kRowsE = 64 * LDK * sizeof(E);
  static constexpr size_t kF64x64 = 64 * LDA * sizeof(float);
  static constexpr size_t kScratch = 4 * 16 * 17 * sizeof(float);  // diagonal inverses
  static constexpr size_t cmax(size_t a, size_t b) { return a > b ? a : b; }
  static constexpr size_t ks = 0;                           // raw k -> k f
  static constexpr size_t qn = ks + kRowsE;                 // raw q -> QN -> A, T_ii (E)
  static constexpr size_t kn = qn + cmax(kRowsE, kF64x64);  // KN -> X
  static constexpr size_t gl = kn + kRowsE;                 // raw g -> gl -> Tdiag, P | V
  static constexpr size_t kV = kScratch;                    // V's offset in the gl region
  static constexpr size_t tab = gl + cmax(64 * LDG * sizeof(float), kV + kRowsE);  // f32 [18][DK]
  static constexpr size_t A = tab + 18 * DK * sizeof(float);  // first, tot (P0), A, TB (E)
  static constexpr size_t beta = A + kF64x64;                 // f32 [64]
  static constexpr size_t gs = beta + 64 * sizeof(float);     // f32 [64]: scalar g
  static constexpr size_t flags = gs + 64 * sizeof(float);    // int [4]
  static constexpr size_t bytes = flags + 4 * sizeof(int);
  static_assert(kV % 16 == 0, "V rows 16-byte aligned");
  static_assert(4 * DK * (sizeof(float) + sizeof(double)) <= kF64x64, "first, tot fit A");
};

template <class E, int DK>
__global__ void __launch_bounds__(kPrepThreads, 2) kda_prep_kernel(Args a) {
  using Ly = PrepLayout<E, DK>;
  using Wk = Work<E, DK>;
  constexpr int LDK = Ly::LDK, LDG = Ly::LDG, LDA = Ly::LDA;
  extern __shared__ __align__(16) unsigned char smem[];
  E* ks = reinterpret_cast<E*>(smem + Ly::ks);
  E* qn = reinterpret_cast<E*>(smem + Ly::qn);
  E* kn = reinterpret_cast<E*>(smem + Ly::kn);
  float* gl = reinterpret_cast<float*>(smem + Ly::gl);
  float* Eb = reinterpret_cast<float*>(smem + Ly::tab);  // [4][DK] e^{gb_i}
  float* Ee = Eb + 4 * DK;                               // [4][DK] e^{gc_L - gc_{e_i}}
  float* Ed = Ee + 4 * DK;                               // [4][DK] e^{-gl_{e_i}}
  float* Ex = Ed + 4 * DK;                               // [6][DK] e^{gc_{16i} - gc_{e_j}}
  float* As = reinterpret_cast<float*>(smem + Ly::A);
  float* bs = reinterpret_cast<float*>(smem + Ly::beta);
  int* flags = reinterpret_cast<int*>(smem + Ly::flags);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g8 = lane >> 2, q4 = lane & 3;
  const int32_t ci = static_cast<int32_t>(blockIdx.x);
  const int h = static_cast<int>(blockIdx.y);
  if (ci >= a.off[a.B]) return;
  const int64_t b = chunk_sequence(a.off, a.B, ci);
  const int64_t seq0 = a.cu[b], len = a.cu[b + 1] - seq0;
  const int64_t cc = ci - a.off[b];
  const int64_t t0 = seq0 + cc * kC;
  const int L = static_cast<int>(imin64(kC, len - cc * kC));
  const int hk = h / (a.Hv / a.Hk);
  const int dk = a.dk;
  const E* qg_src = static_cast<const E*>(a.q) + (t0 * a.Hk + hk) * dk;
  const E* kg_src = static_cast<const E*>(a.k) + (t0 * a.Hk + hk) * dk;
  unsigned char* wbase = a.work + (static_cast<size_t>(ci) * a.Hv + h) * Wk::kBytes;
  E* w_W = reinterpret_cast<E*>(wbase) + Wk::kW;
  E* w_QG = reinterpret_cast<E*>(wbase) + Wk::kQG;
  E* w_KG = reinterpret_cast<E*>(wbase) + Wk::kKG;
  E* w_P = reinterpret_cast<E*>(wbase) + Wk::kP;
  E* w_U = reinterpret_cast<E*>(wbase) + Wk::kU;
  float* w_decay = reinterpret_cast<float*>(wbase + Wk::kDecayByte);
  float* gsc = reinterpret_cast<float*>(smem + Ly::gs);

  // P0: raw k, q and g rows (zero beyond L, dk), beta, then the decays.
  tile_async_rows<E, DK, LDK, kPrepThreads>(ks, kg_src, static_cast<int64_t>(a.Hk) * dk, L, dk);
  tile_async_rows<E, DK, LDK, kPrepThreads>(qn, qg_src, static_cast<int64_t>(a.Hk) * dk, L, dk);
  if (!a.scalar_g)
    tile_async_rows<float, DK, LDG, kPrepThreads>(gl, a.g + (t0 * a.Hv + h) * dk,
                                                  static_cast<int64_t>(a.Hv) * dk, L, dk);
  cp_async_commit();
  if (tid < 4) flags[tid] = 0;
  if (tid < kC) {
    bs[tid] = tid < L ? ld_beta(a.beta, (t0 + tid) * a.Hv + h, a.beta_bf16) : 0.0f;
    gsc[tid] = a.scalar_g && tid < L ? a.g[(t0 + tid) * a.Hv + h] : 0.0f;
  }
  cp_async_wait_all();
  __syncthreads();
  float* first = As;  // [4][DK] until P2
  double* tot = reinterpret_cast<double*>(smem + Ly::A + 4 * DK * sizeof(float));  // [4][DK]
  for (int task = tid; task < 4 * DK; task += kPrepThreads) {
    const int i = task / DK, c = task - i * DK;
    double run = 0.0, sum = 0.0;
    float f0 = 0.0f;
#pragma unroll
    for (int r = 0; r < kSub; ++r) {
      const int t = i * kSub + r;
      const float gv = a.scalar_g ? (c < dk ? gsc[t] : 0.0f) : gl[t * LDG + c];
      if (r == 0) {
        f0 = gv;
      } else {
        run += gv;
      }
      sum += gv;
      gl[t * LDG + c] = static_cast<float>(run);
    }
    tot[i * DK + c] = sum;
    first[i * DK + c] = f0;
    if (-run > kMaxFactorSpan) atomicOr(&flags[i], 1);
  }
  __syncthreads();
  // Per channel: the sub-chunk bases gb_i in double, then the factor tables and the decay.
  const auto expd = [](double x) {  // e^x to f32 accuracy for |x| up to thousands
    const float hi = static_cast<float>(x);
    return expf(hi) * (1.0f + static_cast<float>(x - hi));
  };
  // One thread per (sub-chunk i, channel c): gb_j (j <= 3) by a prefix over the totals, then
  // sub-chunk i's factors.
  for (int task = tid; task < 4 * DK; task += kPrepThreads) {
    const int i = task / DK, c = task - i * DK;
    double gbv[4], gle[4], run = 0.0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      gbv[j] = run + first[j * DK + c];
      run += tot[j * DK + c];
      gle[j] = gl[(16 * j + 15) * LDG + c];
    }
    const int iL = (L - 1) / kSub;
    const double gbL = iL == 0 ? gbv[0] : iL == 1 ? gbv[1] : iL == 2 ? gbv[2] : gbv[3];
    const double gLv = gbL + static_cast<double>(gl[(L - 1) * LDG + c]);
    const double gbi = i == 0 ? gbv[0] : i == 1 ? gbv[1] : i == 2 ? gbv[2] : gbv[3];
    const double glei = i == 0 ? gle[0] : i == 1 ? gle[1] : i == 2 ? gle[2] : gle[3];
    Eb[i * DK + c] = expd(gbi);
    Ee[i * DK + c] = expd(gLv - (gbi + glei));
    Ed[i * DK + c] = expf(static_cast<float>(-glei));  // inf past 88 nats: flagged, unused
#pragma unroll
    for (int j = 0; j < 3; ++j) {
      if (j < i) Ex[(i * (i - 1) / 2 + j) * DK + c] = expd(gbi - (gbv[j] + gle[j]));
    }
    if (i == 0) w_decay[c] = expd(gLv);
  }
  __syncthreads();

  // P1: QN = scale q e^{gl}, KN = k e^{gl}, k f (over raw k) in shared memory; QG, KG to global.
  const float scale = a.scale;
  for (int idx = tid; idx < kC * (DK / 4); idx += kPrepThreads) {
    const int t = idx / (DK / 4), c = 4 * (idx - t * (DK / 4));
    const int i = t / kSub;
    const float4 lt = ld4(gl + t * LDG + c), le = ld4(gl + (16 * i + 15) * LDG + c);
    const float4 eb = ld4(Eb + i * DK + c), ee = ld4(Ee + i * DK + c);
    const float4 x = ld4(qn + t * LDK + c), y = ld4(ks + t * LDK + c);
    const float e0 = __expf(lt.x), e1 = __expf(lt.y), e2 = __expf(lt.z), e3 = __expf(lt.w);
    const float f0 = __expf(le.x - lt.x), f1 = __expf(le.y - lt.y), f2 = __expf(le.z - lt.z),
                f3 = __expf(le.w - lt.w);
    const float q0 = x.x * scale * e0, q1 = x.y * scale * e1, q2 = x.z * scale * e2,
                q3 = x.w * scale * e3;
    const float k0 = y.x * f0, k1 = y.y * f1, k2 = y.z * f2, k3 = y.w * f3;
    st4(qn + t * LDK + c, q0, q1, q2, q3);
    st4(kn + t * LDK + c, y.x * e0, y.y * e1, y.z * e2, y.w * e3);
    st4(ks + t * LDK + c, k0, k1, k2, k3);
    st4(w_QG + t * DK + c, q0 * eb.x, q1 * eb.y, q2 * eb.z, q3 * eb.w);
    st4(w_KG + t * DK + c, k0 * ee.x, k1 * ee.y, k2 * ee.z, k3 * ee.w);
  }
  __syncthreads();

  // P2: the 10 lower 16x16 blocks (i, j) of A (-> shared, times beta_t, s < t) and P (-> global,
  // s <= t); warp w takes blocks w and w + 8. Warps 2..7 also zero one upper block of P each.
  if (warp >= kPrepWarps - 6) {
    // Upper block z: (0,1) (0,2) (0,3) (1,2) (1,3) (2,3).
    const int z = warp - (kPrepWarps - 6);
    const int zi = z < 3 ? 0 : z < 5 ? 1 : 2, zj = z < 3 ? z + 1 : z < 5 ? z - 1 : 3;
    const int r = lane >> 1, c0 = (lane & 1) * 8;
    E* p = w_P + (16 * zi + r) * 64 + 16 * zj + c0;
#pragma unroll
    for (int e = 0; e < 4; ++e) st2(p + 2 * e, 0.0f, 0.0f);
  }
  for (int u = warp; u < 10; u += kPrepWarps) {
    int i = 0;
    while ((i + 1) * (i + 2) / 2 <= u) ++i;
    const int j = u - i * (i + 1) / 2;
    const bool diag = i == j;
    if (diag && flags[i] != 0) {
      // Element-wise diagonal block: exp(gl_t - gl_s) <= 1, raw q from global memory.
      for (int t = 16 * i; t < 16 * i + 16; ++t) {
        for (int s = 16 * i; s < 16 * i + 16; ++s) {
          float sk = 0.0f, sq = 0.0f;
          if (s <= t) {
            for (int c = lane; c < DK; c += 32) {
              const float ex = __expf(gl[t * LDG + c] - gl[s * LDG + c]);
              const bool ok = c < dk;  // s <= t < L
              const int64_t row = static_cast<int64_t>(a.Hk) * dk;
              const float kt = ok && t < L ? ld_f(kg_src + t * row + c) : 0.0f;
              const float kse = ok && s < L ? ld_f(kg_src + s * row + c) * ex : 0.0f;
              const float qr = ok && t < L ? ld_f(qg_src + t * row + c) : 0.0f;
              sk = fmaf(kt, kse, sk);
              sq = fmaf(qr * scale, kse, sq);
            }
            sk = dev::warp_sum(sk);
            sq = dev::warp_sum(sq);
          }
          if (lane == 0) {
            As[t * LDA + s] = s < t ? bs[t] * sk : 0.0f;
            st_f(w_P + t * 64 + s, sq);
          }
        }
      }
      continue;
    }
    float ak[2][4], aq[2][4];
    zero_acc(ak);
    zero_acc(aq);
    // The right factor k_s e^{gc_{16i} - gc_s} = (k f)_s E_ij.
    const float* Ef = diag ? Ed + i * DK : Ex + (i * (i - 1) / 2 + j) * DK;
    if constexpr (sizeof(E) == 2) {
      for (int k0 = 0; k0 < DK; k0 += 16) {
        uint32_t fk[4], fq[4];
        load_a<false>(fk, reinterpret_cast<const bf16*>(kn), LDK, 16 * i, k0);
        load_a<false>(fq, reinterpret_cast<const bf16*>(qn), LDK, 16 * i, k0);
        const float2 ef0 = *reinterpret_cast<const float2*>(Ef + k0 + 2 * q4);
        const float2 ef1 = *reinterpret_cast<const float2*>(Ef + k0 + 8 + 2 * q4);
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const E* kr = ks + (16 * j + 8 * nt + g8) * LDK + k0 + 2 * q4;
          const float2 k0v = ld2(kr), k1v = ld2(kr + 8);
          const uint32_t b0 = pack_bf16(k0v.x * ef0.x, k0v.y * ef0.y);
          const uint32_t b1 = pack_bf16(k1v.x * ef1.x, k1v.y * ef1.y);
          mma16816(ak[nt], fk, b0, b1);
          mma16816(aq[nt], fq, b0, b1);
        }
      }
    } else {
      for (int c = 0; c < DK; ++c) {
        const float klo = ld_f(kn + (16 * i + g8) * LDK + c);
        const float khi = ld_f(kn + (16 * i + g8 + 8) * LDK + c);
        const float qlo = ld_f(qn + (16 * i + g8) * LDK + c);
        const float qhi = ld_f(qn + (16 * i + g8 + 8) * LDK + c);
        const float ef = Ef[c];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const int s0 = 16 * j + 8 * nt + 2 * q4;
          const float r0 = ld_f(ks + s0 * LDK + c) * ef;
          const float r1 = ld_f(ks + (s0 + 1) * LDK + c) * ef;
          ak[nt][0] = fmaf(klo, r0, ak[nt][0]);
          ak[nt][1] = fmaf(klo, r1, ak[nt][1]);
          ak[nt][2] = fmaf(khi, r0, ak[nt][2]);
          ak[nt][3] = fmaf(khi, r1, ak[nt][3]);
          aq[nt][0] = fmaf(qlo, r0, aq[nt][0]);
          aq[nt][1] = fmaf(qlo, r1, aq[nt][1]);
          aq[nt][2] = fmaf(qhi, r0, aq[nt][2]);
          aq[nt][3] = fmaf(qhi, r1, aq[nt][3]);
        }
      }
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int t = 16 * i + g8 + 8 * hr;
        const int s = 16 * j + 8 * nt + 2 * q4;
        As[t * LDA + s] = s < t ? bs[t] * ak[nt][2 * hr] : 0.0f;
        As[t * LDA + s + 1] = s + 1 < t ? bs[t] * ak[nt][2 * hr + 1] : 0.0f;
        st2(w_P + t * 64 + s, s <= t ? aq[nt][2 * hr] : 0.0f,
            s + 1 <= t ? aq[nt][2 * hr + 1] : 0.0f);
      }
    }
  }
  __syncthreads();

  // gl is dead: V streams into its buffer while X = k e^{gc} = KN e^{gb} (in place) and the
  // inverses of the diagonal 16x16 blocks of I + A (forward substitution, f32) are formed.
  E* Vs = reinterpret_cast<E*>(smem + Ly::gl + Ly::kV);
  tile_async_rows<E, DK, LDK, kPrepThreads>(Vs, static_cast<const E*>(a.v) + (t0 * a.Hv + h) * a.dv,
                                            static_cast<int64_t>(a.Hv) * a.dv, L, a.dv);
  cp_async_commit();
  E* X = kn;
  for (int idx = tid; idx < kC * (DK / 4); idx += kPrepThreads) {
    const int t = idx / (DK / 4), c = 4 * (idx - t * (DK / 4));
    const float4 kv = ld4(X + t * LDK + c), eb = ld4(Eb + (t / kSub) * DK + c);
    st4(X + t * LDK + c, kv.x * eb.x, kv.y * eb.y, kv.z * eb.z, kv.w * eb.w);
  }
  float* Td = reinterpret_cast<float*>(smem + Ly::gl);  // [4][16][17]
  if (tid < 64) {
    const int blk = tid >> 4, j = tid & 15;
    const float* Ab = As + (16 * blk) * LDA + 16 * blk;
    float x[16];
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      float v = r == j ? 1.0f : 0.0f;
      if (r > j) {
#pragma unroll
        for (int s = 0; s < r; ++s) v = fmaf(-Ab[r * LDA + s], x[s], v);
      }
      x[r] = v;
    }
#pragma unroll
    for (int r = 0; r < 16; ++r) Td[(blk * 16 + r) * 17 + j] = x[r];
  }
  __syncthreads();
  // The mma operands of the substitution: A and the diagonal inverses, as E (bf16: a copy in
  // QN's buffer; f32: the f32 buffers themselves).
  constexpr bool kBf = sizeof(E) == 2;
  constexpr int LDAe = kBf ? 64 + kPad<E> : LDA, LDTd = kBf ? 16 + kPad<E> : 17;
  E* Ae = kBf ? qn : reinterpret_cast<E*>(As);
  E* Tde = kBf ? qn + 64 * LDAe : reinterpret_cast<E*>(Td);
  if constexpr (kBf) {
    for (int idx = tid; idx < 64 * 32; idx += kPrepThreads) {
      const int t = idx >> 5, s = 2 * (idx & 31);
      st2(Ae + t * LDAe + s, As[t * LDA + s], As[t * LDA + s + 1]);
    }
    for (int idx = tid; idx < 4 * 16 * 8; idx += kPrepThreads) {
      const int blk = idx >> 7, r = (idx >> 3) & 15, s = 2 * (idx & 7);
      st2(Tde + (blk * 16 + r) * LDTd + s, Td[(blk * 16 + r) * 17 + s],
          Td[(blk * 16 + r) * 17 + s + 1]);
    }
  }
  cp_async_wait_all();
  __syncthreads();

  // P3: [W | U0] = (I + A)^-1 diag(beta) [X | V] by blocked forward substitution, block row i:
  //   Y_i = T_ii (beta_i [X | V]_i - sum_{j < i} A_ij Y_j).
  // Each warp owns a slice of the 2 D columns for all 64 rows and overwrites [X | V] with Y in
  // place: a slice depends only on itself, so the warps need no barrier.
  {
    constexpr int NTW = DK >= 128 ? 2 : 1;  // n8 tiles per warp
    constexpr int CW = 8 * NTW;
    constexpr int kActive = 2 * DK / CW;
    static_assert(kActive <= kPrepWarps, "column slices");
    if (warp < kActive) {
      const int col0 = warp * CW;
      const bool in_v = col0 >= DK;
      E* Y = in_v ? Vs : X;
      const int n0 = in_v ? col0 - DK : col0;
      E* dst = in_v ? w_U : w_W;
      for (int i = 0; i < 4; ++i) {
        float r[NTW][4], sub[NTW][4], y[NTW][4];
        zero_acc(sub);
        zero_acc(y);
        for (int j = 0; j < i; ++j)
          mma_kstep<NTW, false>(sub, Ae, LDAe, 16 * i, Y, LDK, n0, 16 * j);
#pragma unroll
        for (int nt = 0; nt < NTW; ++nt) {
#pragma unroll
          for (int hr = 0; hr < 2; ++hr) {
            const int t = 16 * i + g8 + 8 * hr, n = n0 + 8 * nt + 2 * q4;
            const float2 xv = ld2(Y + t * LDK + n);
            r[nt][2 * hr] = bs[t] * xv.x - sub[nt][2 * hr];
            r[nt][2 * hr + 1] = bs[t] * xv.y - sub[nt][2 * hr + 1];
          }
        }
        __syncwarp();  // the slice's reads of rows 16i.. are done
#pragma unroll
        for (int nt = 0; nt < NTW; ++nt) {
#pragma unroll
          for (int hr = 0; hr < 2; ++hr) {
            const int t = 16 * i + g8 + 8 * hr, n = n0 + 8 * nt + 2 * q4;
            st2(Y + t * LDK + n, r[nt][2 * hr], r[nt][2 * hr + 1]);
          }
        }
        __syncwarp();
        mma_kstep<NTW, false>(y, Tde + i * 16 * LDTd, LDTd, 0, Y + 16 * i * LDK, LDK, n0, 0);
        __syncwarp();
#pragma unroll
        for (int nt = 0; nt < NTW; ++nt) {
#pragma unroll
          for (int hr = 0; hr < 2; ++hr) {
            const int t = 16 * i + g8 + 8 * hr, n = n0 + 8 * nt + 2 * q4;
            st2(Y + t * LDK + n, y[nt][2 * hr], y[nt][2 * hr + 1]);
            st2(dst + t * DK + n, y[nt][2 * hr], y[nt][2 * hr + 1]);
          }
        }
        __syncwarp();
      }
    }
  }
}

// ---- 3. the state pass -------------------------------------------------------------------------

template <class E, int DK, int BV>
struct StateLayout {
  static constexpr int P = kPad<E>;
  static constexpr int LDK = DK + P, LD64 = 64 + P, LDV = BV + P;
  static constexpr size_t kRowsK = 64 * LDK * sizeof(E);
  static constexpr size_t kRows64 = 64 * LD64 * sizeof(E);
  static constexpr size_t kRowsV = 64 * LDV * sizeof(E);
  static constexpr size_t sW = 0, sQ = sW + kRowsK, sK = sQ + kRowsK, sP = sK + kRowsK,
                          sU = sP + kRows64, sD = sU + kRowsV,
                          stage = (sD + DK * sizeof(float) + 15) / 16 * 16;
  // Operand stages in flight: as many as fit next to the state copies (3 for bf16 at 32 value
  // columns, 2 at 64; f32 stages are twice the size: 1).
  static constexpr size_t kFixed = DK * LDV * sizeof(E) + kRowsV;
  static constexpr int STAGES = 3 * stage + kFixed <= 227 * 1024   ? 3
                                : 2 * stage + kFixed <= 227 * 1024 ? 2
                                                                   : 1;
  static constexpr size_t Se = STAGES * stage;  // E [DK][LDV]: the state as an mma operand
  static constexpr size_t Vn = Se + DK * LDV * sizeof(E);  // E [64][LDV]: v_new
  static constexpr size_t bytes = Vn + kRowsV;
};

template <class E, int DK, int BV>
__global__ void __launch_bounds__(kThreads, 1) kda_state_kernel(Args a) {
  using Ly = StateLayout<E, DK, BV>;
  using Wk = Work<E, DK>;
  constexpr int LDK = Ly::LDK, LD64 = Ly::LD64, LDV = Ly::LDV;
  constexpr int NT = BV / 8;               // n8 tiles of a value tile
  constexpr int FPW = (DK / 16) * NT / 8;  // state fragments per warp
  static_assert(FPW >= 1 && FPW <= NT, "state tiling");
  extern __shared__ __align__(16) unsigned char smem[];
  E* Se = reinterpret_cast<E*>(smem + Ly::Se);
  E* Vn = reinterpret_cast<E*>(smem + Ly::Vn);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g8 = lane >> 2, q4 = lane & 3;
  const int64_t bh = blockIdx.x / a.ntiles;
  const int tile = static_cast<int>(blockIdx.x - bh * a.ntiles);
  const int h = static_cast<int>(bh % a.Hv);
  const int64_t b = bh / a.Hv;
  const int64_t seq0 = a.cu[b], len = a.cu[b + 1] - seq0;
  if (len <= a.rmax) return;
  const int64_t slot = a.slots[b];
  if (slot < 0 || slot >= a.num_slots) return;
  const int dk = a.dk, dv = a.dv, v0 = tile * BV;
  const int nc = static_cast<int>((len + kC - 1) / kC);
  const int32_t ci0 = a.off[b];
  float* Sg = a.pool + (slot * a.Hv + h) * static_cast<int64_t>(dk) * dv + v0;
  E* osrc = a.out != nullptr ? static_cast<E*>(a.out) + h * static_cast<int64_t>(dv) + v0 : nullptr;
  const int64_t vstride = static_cast<int64_t>(a.Hv) * dv;

  auto load_stage = [&](int st, int c) {
    unsigned char* s = smem + st * Ly::stage;
    const unsigned char* w = a.work + (static_cast<size_t>(ci0 + c) * a.Hv + h) * Wk::kBytes;
    const E* we = reinterpret_cast<const E*>(w);
    tile_async_full<E, DK, LDK, DK>(reinterpret_cast<E*>(s + Ly::sW), we + Wk::kW);
    tile_async_full<E, DK, LDK, DK>(reinterpret_cast<E*>(s + Ly::sQ), we + Wk::kQG);
    tile_async_full<E, DK, LDK, DK>(reinterpret_cast<E*>(s + Ly::sK), we + Wk::kKG);
    tile_async_full<E, 64, LD64, 64, true>(reinterpret_cast<E*>(s + Ly::sP), we + Wk::kP);
    tile_async_full<E, BV, LDV, DK>(reinterpret_cast<E*>(s + Ly::sU), we + Wk::kU + v0);
    for (int i = tid; i < DK / 4; i += kThreads)
      cp_async16(s + Ly::sD + 16 * i, w + Wk::kDecayByte + 16 * i, true);
  };

  // The state tile in registers: warp's fragments at m-tile sm, n-tiles sn0 .. sn0 + FPW.
  const int sm = (warp * FPW) / NT, sn0 = (warp * FPW) % NT;
  float S[FPW][4];
#pragma unroll
  for (int f = 0; f < FPW; ++f) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int c = 16 * sm + g8 + 8 * hr, j = 8 * (sn0 + f) + 2 * q4;
      float2 x = make_float2(0.0f, 0.0f);
      if (c < dk && v0 + j < dv) x = *reinterpret_cast<const float2*>(Sg + int64_t{c} * dv + j);
      S[f][2 * hr] = x.x;
      S[f][2 * hr + 1] = x.y;
    }
  }

  // P's blocks above the diagonal are zero: written once here, never loaded.
  for (int st = 0; st < Ly::STAGES; ++st) {
    E* sp = reinterpret_cast<E*>(smem + st * Ly::stage + Ly::sP);
    for (int idx = tid; idx < 64 * 64; idx += kThreads) {
      const int r = idx >> 6, col = idx & 63;
      if (col >= 16 * (r / 16 + 1)) st_f(sp + r * LD64 + col, 0.0f);
    }
  }
  // Prologue: the first STAGES - 1 chunks' operands in flight (one commit group each, empty
  // past the last chunk, so that the group count stays uniform).
#pragma unroll
  for (int c = 0; c < (Ly::STAGES > 1 ? Ly::STAGES - 1 : 1); ++c) {
    if (c < nc) load_stage(c, c);
    cp_async_commit();
  }
  for (int c = 0; c < nc; ++c) {
    const int st = c % Ly::STAGES;
    const unsigned char* s = smem + st * Ly::stage;
    const E* sW = reinterpret_cast<const E*>(s + Ly::sW);
    const E* sQ = reinterpret_cast<const E*>(s + Ly::sQ);
    const E* sK = reinterpret_cast<const E*>(s + Ly::sK);
    const E* sP = reinterpret_cast<const E*>(s + Ly::sP);
    const E* sU = reinterpret_cast<const E*>(s + Ly::sU);
    const float* sD = reinterpret_cast<const float*>(s + Ly::sD);
#pragma unroll
    for (int f = 0; f < FPW; ++f) {
      const int r0 = 16 * sm + g8, j = 8 * (sn0 + f) + 2 * q4;
      st2(Se + r0 * LDV + j, S[f][0], S[f][1]);
      st2(Se + (r0 + 8) * LDV + j, S[f][2], S[f][3]);
    }
    if (a.state_before != nullptr) {
      float* sb = a.state_before + (static_cast<int64_t>(ci0 + c) * a.Hv + h) * dk * dv + v0;
#pragma unroll
      for (int f = 0; f < FPW; ++f) {
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int row = 16 * sm + g8 + 8 * hr, j = 8 * (sn0 + f) + 2 * q4;
          if (row < dk && v0 + j < dv)
            *reinterpret_cast<float2*>(sb + int64_t{row} * dv + j) =
                make_float2(S[f][2 * hr], S[f][2 * hr + 1]);
        }
      }
    }
    if constexpr (Ly::STAGES > 1) {
      cp_async_wait<Ly::STAGES - 2>();  // chunk c's group has landed
    } else {
      cp_async_wait_all();
    }
    __syncthreads();
    if constexpr (Ly::STAGES > 1) {
      // Into the stage read during chunk c - 1 (every warp is past it: the barrier above).
      const int cn = c + Ly::STAGES - 1;
      if (cn < nc) load_stage(cn % Ly::STAGES, cn);
      cp_async_commit();
    }
    const int L = static_cast<int>(imin64(kC, len - int64_t{c} * kC));
    float qs[NT][4];
    zero_acc(qs);
    if (warp < 4) {
      // v_new = U0 - W S for rows 16 warp..
      float ws[NT][4];
      zero_acc(ws);
      warp_mma_split<NT, false>(ws, sW, LDK, 16 * warp, Se, LDV, 0, DK);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int t = 16 * warp + g8, j = 8 * nt + 2 * q4;
        const float2 u0 = ld2(sU + t * LDV + j), u1 = ld2(sU + (t + 8) * LDV + j);
        st2(Vn + t * LDV + j, u0.x - ws[nt][0], u0.y - ws[nt][1]);
        st2(Vn + (t + 8) * LDV + j, u1.x - ws[nt][2], u1.y - ws[nt][3]);
      }
    } else if (osrc != nullptr) {
      warp_mma_split<NT, false>(qs, sQ, LDK, 16 * (warp - 4), Se, LDV, 0, DK);
    }
    __syncthreads();
    if (warp >= 4 && osrc != nullptr) {
      // O = QG S + P v_new for rows 16 (warp - 4)..
      const int m0 = 16 * (warp - 4);
      warp_mma<NT, false>(qs, sP, LD64, m0, Vn, LDV, 0, 64);
      const int64_t row0 = seq0 + int64_t{c} * kC;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int t = m0 + g8 + 8 * hr, j = 8 * nt + 2 * q4;
          if (t < L && v0 + j < dv)
            st2(osrc + (row0 + t) * vstride + j, qs[nt][2 * hr], qs[nt][2 * hr + 1]);
        }
      }
    }
    // S = diag(decay) S + KG^T v_new.
    const float dlo = sD[16 * sm + g8], dhi = sD[16 * sm + g8 + 8];
#pragma unroll
    for (int f = 0; f < FPW; ++f) {
      S[f][0] *= dlo;
      S[f][1] *= dlo;
      S[f][2] *= dhi;
      S[f][3] *= dhi;
    }
    warp_mma<FPW, true>(S, sK, LDK, 16 * sm, Vn, LDV, 8 * sn0, 64);
    if constexpr (Ly::STAGES == 1) {
      __syncthreads();  // every read of the stage done
      if (c + 1 < nc) {
        load_stage(0, c + 1);
        cp_async_commit();
      }
    }
  }
#pragma unroll
  for (int f = 0; f < FPW; ++f) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int c = 16 * sm + g8 + 8 * hr, j = 8 * (sn0 + f) + 2 * q4;
      if (c < dk && v0 + j < dv)
        *reinterpret_cast<float2*>(Sg + int64_t{c} * dv + j) =
            make_float2(S[f][2 * hr], S[f][2 * hr + 1]);
    }
  }
}

// ---- 4. the state pass in reverse (the chunked backward) ------------------------------------
// With v_new = U0 - W S, O = QG S + P v_new and S' = diag(decay) S + KG^T v_new, the gradient of
// the state before a chunk follows from that after it (dS) and the chunk's dO alone:
//   dv_new = P^T dO + KG dS,   dS <- diag(decay) dS + QG^T dO - W^T dv_new,
// every operand from the preparation's workspace. Columns of dS are independent: one block per
// (sequence, value head, 32 value columns), f32 on CUDA cores; thread (i or s, j) with lane j, so
// that the row operands are warp broadcasts and the column operands conflict-free. Rows past the
// chunk's end and channels past dk are zeroed on load (the workspace is not relied on there).

constexpr int kBackCols = 32, kBackThreads = 256, kBackWarps = kBackThreads / 32;

template <int D>
struct StateBackLayout {
  static constexpr size_t W = 0, QG = W + 64 * D, KG = QG + 64 * D, P = KG + 64 * D,
                          dO = P + 64 * 64, dV = dO + 64 * kBackCols, dS = dV + 64 * kBackCols,
                          decay = dS + D * kBackCols, floats = decay + D;
  static constexpr size_t bytes = floats * sizeof(float);
};

struct StateBackArgs {
  const float* d_out;
  const float* d_final;
  float* d_after;
  float* d_initial;
};

template <int D>
__global__ void __launch_bounds__(kBackThreads) kda_state_backward_kernel(Args a, StateBackArgs r) {
  using Ly = StateBackLayout<D>;
  using Wk = Work<float, D>;
  extern __shared__ __align__(16) unsigned char smem[];
  float* sm = reinterpret_cast<float*>(smem);
  float *sW = sm + Ly::W, *sQ = sm + Ly::QG, *sK = sm + Ly::KG, *sP = sm + Ly::P;
  float *sO = sm + Ly::dO, *sV = sm + Ly::dV, *sS = sm + Ly::dS, *sD = sm + Ly::decay;
  const int tid = threadIdx.x, j = tid & 31, warp = tid >> 5;
  const int64_t bh = blockIdx.x / a.ntiles;
  const int v0 = static_cast<int>(blockIdx.x - bh * a.ntiles) * kBackCols;
  const int h = static_cast<int>(bh % a.Hv);
  const int64_t b = bh / a.Hv;
  const int64_t seq0 = a.cu[b], len = a.cu[b + 1] - seq0;
  const int dk = a.dk, dv = a.dv;
  const int64_t area = static_cast<int64_t>(dk) * dv, vstride = static_cast<int64_t>(a.Hv) * dv;
  const bool col = v0 + j < dv;
  const int nc = static_cast<int>((len + kC - 1) / kC);
  const int32_t ci0 = a.off[b];
  const int64_t state = (b * a.Hv + h) * area + v0 + j;
  for (int i = warp; i < D; i += kBackWarps)
    sS[i * kBackCols + j] =
        i < dk && col && r.d_final != nullptr ? r.d_final[state + int64_t{i} * dv] : 0.0f;
  for (int c = nc - 1; c >= 0; --c) {
    const int L = static_cast<int>(imin64(kC, len - int64_t{c} * kC));
    const int64_t ci = ci0 + c;
    const float* w = reinterpret_cast<const float*>(a.work + (ci * a.Hv + h) * Wk::kBytes);
    __syncthreads();  // the previous chunk's reads of the operands are done
    for (int idx = tid; idx < 64 * D; idx += kBackThreads) {
      const int t = idx / D, i = idx % D;
      const bool in = t < L && i < dk;
      sW[idx] = in ? w[Wk::kW + idx] : 0.0f;
      sQ[idx] = in ? w[Wk::kQG + idx] : 0.0f;
      sK[idx] = in ? w[Wk::kKG + idx] : 0.0f;
    }
    for (int idx = tid; idx < 64 * 64; idx += kBackThreads) {
      const int t = idx >> 6, s = idx & 63;
      sP[idx] = t < L && s <= t ? w[Wk::kP + idx] : 0.0f;
    }
    for (int t = warp; t < 64; t += kBackWarps)
      sO[t * kBackCols + j] =
          t < L && col ? r.d_out[(seq0 + int64_t{c} * kC + t) * vstride + h * dv + v0 + j] : 0.0f;
    for (int i = tid; i < D; i += kBackThreads)
      sD[i] = i < dk ? reinterpret_cast<const float*>(a.work + (ci * a.Hv + h) * Wk::kBytes +
                                                      Wk::kDecayByte)[i]
                     : 0.0f;
    // dS is the gradient of the state after chunk c.
    if (col)
      for (int i = warp; i < dk; i += kBackWarps)
        r.d_after[(ci * a.Hv + h) * area + int64_t{i} * dv + v0 + j] = sS[i * kBackCols + j];
    __syncthreads();
    // dv_new, rows s = warp + 8 m.
    {
      float acc[8];
#pragma unroll
      for (int m = 0; m < 8; ++m) acc[m] = 0.0f;
      for (int t = 0; t < 64; ++t) {
        const float o = sO[t * kBackCols + j];
#pragma unroll
        for (int m = 0; m < 8; ++m) acc[m] += sP[t * 64 + warp + 8 * m] * o;
      }
      for (int i = 0; i < D; ++i) {
        const float x = sS[i * kBackCols + j];
#pragma unroll
        for (int m = 0; m < 8; ++m) acc[m] += sK[(warp + 8 * m) * D + i] * x;
      }
#pragma unroll
      for (int m = 0; m < 8; ++m) sV[(warp + 8 * m) * kBackCols + j] = acc[m];
    }
    __syncthreads();
    // dS, rows i = warp + 8 m: each thread rewrites only its own elements.
    {
      constexpr int M = D / kBackWarps;
      float acc[M];
#pragma unroll
      for (int m = 0; m < M; ++m) acc[m] = sD[warp + 8 * m] * sS[(warp + 8 * m) * kBackCols + j];
      for (int t = 0; t < 64; ++t) {
        const float o = sO[t * kBackCols + j], x = sV[t * kBackCols + j];
#pragma unroll
        for (int m = 0; m < M; ++m)
          acc[m] += sQ[t * D + warp + 8 * m] * o - sW[t * D + warp + 8 * m] * x;
      }
#pragma unroll
      for (int m = 0; m < M; ++m) sS[(warp + 8 * m) * kBackCols + j] = acc[m];
    }
  }
  if (r.d_initial != nullptr && col) {
    __syncthreads();
    for (int i = warp; i < dk; i += kBackWarps)
      r.d_initial[state + int64_t{i} * dv] = sS[i * kBackCols + j];
  }
}

// ---- the token recurrence over the varlen batch --------------------------------------------
// kernels/cuda/kda.cu's kda_recurrent_kernel with the sequence from blockIdx.z, its state in the
// pool, bf16 or f32 inputs. Lane x owns value column j0 + x, row group y rows y, y + 8, ...

constexpr int kRCols = 32, kRRowGroups = 8, kRMaxDk = 256;

template <class E, int kMaxI>
__global__ void __launch_bounds__(kRCols* kRRowGroups, kMaxI <= 16 ? 4 : 2)
    kda_recurrent_varlen_kernel(Args a) {
  __shared__ float ks[2][kRMaxDk], qs[2][kRMaxDk], es[2][kRMaxDk];
  __shared__ float vs[2][kRCols], bsh[2];
  __shared__ float red1[kRRowGroups][kRCols], red2[kRRowGroups][kRCols];
  const int h = blockIdx.x;
  const int64_t b = blockIdx.z;
  const int64_t seq0 = a.cu[b], T = a.cu[b + 1] - seq0;
  if (T <= 0 || T > a.rmax) return;
  const int64_t slot = a.slots[b];
  if (slot < 0 || slot >= a.num_slots) return;
  const int Hk = a.Hk, Hv = a.Hv, dk = a.dk, dv = a.dv;
  const int hk = h / (Hv / Hk);
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int tid = ty * kRCols + tx;
  const int col = blockIdx.y * kRCols + tx;
  const bool col_ok = col < dv;
  const E* q = static_cast<const E*>(a.q);
  const E* k = static_cast<const E*>(a.k);
  const E* v = static_cast<const E*>(a.v);
  E* out = static_cast<E*>(a.out);
  float* S_g = a.pool + (slot * Hv + h) * static_cast<int64_t>(dk) * dv;

  float S[kMaxI];
#pragma unroll
  for (int ii = 0; ii < kMaxI; ++ii) {
    const int i = ty + ii * kRRowGroups;
    S[ii] = (i < dk && col_ok) ? S_g[static_cast<int64_t>(i) * dv + col] : 0.0f;
  }
  for (int64_t t = 0; t < T; ++t) {
    const int buf = static_cast<int>(t & 1);
    const int64_t row = seq0 + t;
    const int64_t kq_off = (row * Hk + hk) * dk;
    const int64_t hv_row = row * Hv + h;
    for (int i = tid; i < dk; i += kRCols * kRRowGroups) {
      ks[buf][i] = ld_f(k + kq_off + i);
      qs[buf][i] = ld_f(q + kq_off + i) * a.scale;
      es[buf][i] = expf(a.scalar_g ? a.g[hv_row] : a.g[hv_row * dk + i]);
    }
    if (tid < kRCols) {
      const int cc = blockIdx.y * kRCols + tid;
      vs[buf][tid] = cc < dv ? ld_f(v + hv_row * dv + cc) : 0.0f;
    }
    if (tid == 0) bsh[buf] = ld_beta(a.beta, hv_row, a.beta_bf16);
    __syncthreads();
    float part = 0.0f;
#pragma unroll
    for (int ii = 0; ii < kMaxI; ++ii) {
      const int i = ty + ii * kRRowGroups;
      if (i < dk) {
        const float s = S[ii] * es[buf][i];
        S[ii] = s;
        part += ks[buf][i] * s;
      }
    }
    red1[ty][tx] = part;
    __syncthreads();
    float kv = 0.0f;
#pragma unroll
    for (int r = 0; r < kRRowGroups; ++r) kv += red1[r][tx];
    const float u = bsh[buf] * (vs[buf][tx] - kv);
    float po = 0.0f;
#pragma unroll
    for (int ii = 0; ii < kMaxI; ++ii) {
      const int i = ty + ii * kRRowGroups;
      if (i < dk) {
        const float s = S[ii] + ks[buf][i] * u;
        S[ii] = s;
        po += qs[buf][i] * s;
      }
    }
    red2[ty][tx] = po;
    __syncthreads();
    if (ty == 0 && col_ok) {
      float o = 0.0f;
#pragma unroll
      for (int r = 0; r < kRRowGroups; ++r) o += red2[r][tx];
      st_f(out + hv_row * dv + col, o);
    }
  }
#pragma unroll
  for (int ii = 0; ii < kMaxI; ++ii) {
    const int i = ty + ii * kRRowGroups;
    if (i < dk && col_ok) S_g[static_cast<int64_t>(i) * dv + col] = S[ii];
  }
}

// ---- self test of the warp GEMM ------------------------------------------------------------

__global__ void kda_mma_selftest_kernel(const bf16* A, const bf16* B, float* C, float* Ct) {
  __shared__ __align__(16) bf16 As[64 * 72];
  __shared__ __align__(16) bf16 Bs[64 * 40];
  for (int i = threadIdx.x; i < 64 * 64; i += blockDim.x) As[(i / 64) * 72 + i % 64] = A[i];
  for (int i = threadIdx.x; i < 64 * 32; i += blockDim.x) Bs[(i / 32) * 40 + i % 32] = B[i];
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g8 = lane >> 2, q4 = lane & 3;
  float c[4][4], ct[3][4];
  zero_acc(c);
  zero_acc(ct);
  warp_mma<4, false>(c, As, 72, 16 * warp, Bs, 40, 0, 64);
  warp_mma<3, true>(ct, As, 72, 16 * warp, Bs, 40, 8, 64);  // odd NT: the x2 path
  for (int nt = 0; nt < 4; ++nt)
    for (int r = 0; r < 4; ++r) {
      const int row = 16 * warp + g8 + 8 * (r >> 1), col = 8 * nt + 2 * q4 + (r & 1);
      C[row * 32 + col] = c[nt][r];
      if (nt == 0)
        Ct[row * 32 + col] = 0.0f;
      else
        Ct[row * 32 + col] = ct[nt - 1][r];
    }
}

// ---- launch helpers --------------------------------------------------------------------------

template <class Kernel>
void set_smem(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    LOOM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(bytes)));
}

// The padded head size D of both dk and dv.
int round_d(const launch::KdaVarlenArgs& a) {
  const int d = a.dk > a.dv ? a.dk : a.dv;
  return d <= 32 ? 32 : d <= 64 ? 64 : 128;
}

size_t per_chunk_head(const launch::KdaVarlenArgs& a) {
  const int DK = round_d(a);
  if (a.bf16) {
    return DK == 32   ? Work<bf16, 32>::kBytes
           : DK == 64 ? Work<bf16, 64>::kBytes
                      : Work<bf16, 128>::kBytes;
  }
  return DK == 32   ? Work<float, 32>::kBytes
         : DK == 64 ? Work<float, 64>::kBytes
                    : Work<float, 128>::kBytes;
}

int64_t chunk_bound(const launch::KdaVarlenArgs& a) { return a.N / kC + a.B; }

template <class E, int DK, int BV>
void run_chunked(cudaStream_t stream, const Args& args, int64_t nchunks, int phases) {
  using PL = PrepLayout<E, DK>;
  using SL = StateLayout<E, DK, BV>;
  static const bool once = [] {
    set_smem(kda_prep_kernel<E, DK>, PL::bytes);
    set_smem(kda_state_kernel<E, DK, BV>, SL::bytes);
    return true;
  }();
  (void)once;
  if (phases & 1) {
    const dim3 pgrid(static_cast<unsigned>(nchunks), static_cast<unsigned>(args.Hv));
    kda_prep_kernel<E, DK><<<pgrid, kPrepThreads, PL::bytes, stream>>>(args);
    LOOM_CUDA_CHECK_LAUNCH();
  }
  if (phases & 2) {
    const int64_t blocks = args.B * args.Hv * args.ntiles;
    LOOM_CHECK_GRID(blocks);
    kda_state_kernel<E, DK, BV>
        <<<static_cast<unsigned>(blocks), kThreads, SL::bytes, stream>>>(args);
    LOOM_CUDA_CHECK_LAUNCH();
  }
}

template <class E, int DK>
void run_chunked_bv(cudaStream_t stream, Args args, int64_t nchunks, int bv, int phases) {
  if (bv == 64) {
    args.ntiles = (args.dv + 63) / 64;
    run_chunked<E, DK, 64>(stream, args, nchunks, phases);
  } else {
    args.ntiles = (args.dv + 31) / 32;
    run_chunked<E, DK, 32>(stream, args, nchunks, phases);
  }
}

Args make_args(const launch::KdaVarlenArgs& a, int64_t rmax) {
  Args r{};
  r.q = a.q;
  r.k = a.k;
  r.v = a.v;
  r.g = a.g;
  r.beta = a.beta;
  r.out = a.out;
  r.pool = a.pool;
  r.slots = a.slots;
  r.cu = a.cu;
  r.state_before = a.state_before;
  r.scale = a.scale;
  r.B = a.B;
  r.num_slots = a.num_slots;
  r.rmax = rmax;
  r.Hk = a.Hk;
  r.Hv = a.Hv;
  r.dk = a.dk;
  r.dv = a.dv;
  r.scalar_g = a.scalar_g && a.dk != 1;
  r.beta_bf16 = a.beta_bf16;
  return r;
}

}  // namespace

namespace launch {

bool kda_chunked_supported(const KdaVarlenArgs& a) {
  const auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  return a.dk >= 1 && a.dk <= 128 && a.dv <= 128 && a.dk % 8 == 0 && a.dv % 8 == 0 && a.Hk > 0 &&
         a.Hv % a.Hk == 0 && aligned(a.q) && aligned(a.k) && aligned(a.v) && aligned(a.out) &&
         aligned(a.pool) && (a.scalar_g || aligned(a.g)) &&
         a.N / kC + a.B < (int64_t{1} << 31) / (a.Hv > 0 ? a.Hv : 1);
}

size_t kda_chunked_workspace_bytes(const KdaVarlenArgs& a) {
  const size_t table = (static_cast<size_t>(a.B + 1) * sizeof(int32_t) + 255) / 256 * 256;
  return table + static_cast<size_t>(chunk_bound(a)) * a.Hv * per_chunk_head(a);
}

void kda_chunked_varlen(cudaStream_t stream, const KdaVarlenArgs& a, int64_t rmax, void* workspace,
                        int bv, int phases) {
  if (a.B == 0 || a.N == 0 || a.Hv == 0 || a.dv == 0) return;
  if (!kda_chunked_supported(a)) {
    std::fprintf(stderr,
                 "kda_chunked_varlen (CUDA): unsupported shape or alignment (dk %d dv %d)\n", a.dk,
                 a.dv);
    std::abort();
  }
  Args args = make_args(a, rmax);
  args.off = static_cast<int32_t*>(workspace);
  const size_t table = (static_cast<size_t>(a.B + 1) * sizeof(int32_t) + 255) / 256 * 256;
  args.work = static_cast<unsigned char*>(workspace) + table;
  if (phases & 1) {
    kda_chunk_table_kernel<<<1, 1024, 0, stream>>>(a.cu, a.B, rmax, const_cast<int32_t*>(args.off));
    LOOM_CUDA_CHECK_LAUNCH();
  }
  const int64_t nchunks = chunk_bound(a);
  if (bv == 0) bv = 32;
  const int DK = round_d(a);
  if (a.bf16) {
    if (DK == 32)
      run_chunked_bv<bf16, 32>(stream, args, nchunks, bv, phases);
    else if (DK == 64)
      run_chunked_bv<bf16, 64>(stream, args, nchunks, bv, phases);
    else
      run_chunked_bv<bf16, 128>(stream, args, nchunks, bv, phases);
  } else {
    if (DK == 32)
      run_chunked_bv<float, 32>(stream, args, nchunks, bv, phases);
    else if (DK == 64)
      run_chunked_bv<float, 64>(stream, args, nchunks, bv, phases);
    else
      run_chunked_bv<float, 128>(stream, args, nchunks, bv, phases);
  }
}

const int32_t* kda_chunked_chunk_table(const void* workspace) {
  return static_cast<const int32_t*>(workspace);
}

void kda_chunked_state_backward(cudaStream_t stream, const KdaVarlenArgs& a, const void* workspace,
                                const float* d_out, const float* d_final, float* d_state_after,
                                float* d_initial) {
  if (a.B == 0 || a.Hv == 0 || a.dv == 0) return;
  if (a.bf16 || !kda_chunked_supported(a)) {
    std::fprintf(stderr, "kda_chunked_state_backward (CUDA): f32 and a supported shape only\n");
    std::abort();
  }
  Args args = make_args(a, 0);
  const size_t table = (static_cast<size_t>(a.B + 1) * sizeof(int32_t) + 255) / 256 * 256;
  args.off = static_cast<const int32_t*>(workspace);
  args.work = static_cast<unsigned char*>(const_cast<void*>(workspace)) + table;
  args.ntiles = (a.dv + kBackCols - 1) / kBackCols;
  const StateBackArgs r{d_out, d_final, d_state_after, d_initial};
  const int64_t blocks = a.B * a.Hv * args.ntiles;
  LOOM_CHECK_GRID(blocks);
  const auto go = [&](auto kernel, size_t bytes) {
    set_smem(kernel, bytes);
    kernel<<<static_cast<unsigned>(blocks), kBackThreads, bytes, stream>>>(args, r);
    LOOM_CUDA_CHECK_LAUNCH();
  };
  const int D = round_d(a);
  if (D == 32)
    go(kda_state_backward_kernel<32>, StateBackLayout<32>::bytes);
  else if (D == 64)
    go(kda_state_backward_kernel<64>, StateBackLayout<64>::bytes);
  else
    go(kda_state_backward_kernel<128>, StateBackLayout<128>::bytes);
}

void kda_recurrent_varlen(cudaStream_t stream, const KdaVarlenArgs& a, int64_t rmax) {
  if (a.B == 0 || a.N == 0 || a.Hv == 0 || a.dv == 0 || rmax <= 0) return;
  if (a.dk > kRMaxDk || a.B > 65535 || a.Hv > 2147483647) {
    std::fprintf(stderr, "kda_recurrent_varlen (CUDA): dk %d > %d or B %lld > 65535\n", a.dk,
                 kRMaxDk, static_cast<long long>(a.B));
    std::abort();
  }
  const Args args = make_args(a, rmax);
  const dim3 grid(static_cast<unsigned>(a.Hv), static_cast<unsigned>((a.dv + kRCols - 1) / kRCols),
                  static_cast<unsigned>(a.B));
  const dim3 block(kRCols, kRRowGroups);
  const auto go = [&](auto kernel) { kernel<<<grid, block, 0, stream>>>(args); };
  if (a.bf16) {
    if (a.dk <= 32)
      go(kda_recurrent_varlen_kernel<bf16, 4>);
    else if (a.dk <= 64)
      go(kda_recurrent_varlen_kernel<bf16, 8>);
    else if (a.dk <= 128)
      go(kda_recurrent_varlen_kernel<bf16, 16>);
    else
      go(kda_recurrent_varlen_kernel<bf16, 32>);
  } else {
    if (a.dk <= 32)
      go(kda_recurrent_varlen_kernel<float, 4>);
    else if (a.dk <= 64)
      go(kda_recurrent_varlen_kernel<float, 8>);
    else if (a.dk <= 128)
      go(kda_recurrent_varlen_kernel<float, 16>);
    else
      go(kda_recurrent_varlen_kernel<float, 32>);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

void kda_mma_selftest(cudaStream_t stream, const uint16_t* A, const uint16_t* B, float* C,
                      float* Ct) {
  kda_mma_selftest_kernel<<<1, 128, 0, stream>>>(reinterpret_cast<const bf16*>(A),
                                                 reinterpret_cast<const bf16*>(B), C, Ct);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace launch
}  // namespace loom::cuda
