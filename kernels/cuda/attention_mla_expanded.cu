// MLA prefill in expanded form on tensor cores (FlashAttention-2 style, mma.sync m16n8k16 with
// bf16 operands and f32 accumulation): one sequence's new rows over one block of its keys, with
// the online-softmax state carried across blocks (kernels/cuda/mla_expanded_launch.h).
//
// A block of 8 warps takes 128 query rows of one head; warp w owns rows 16 w .. 16 w + 15 and
// holds their Q fragments (192 dims: 48 registers) for the whole block. Keys come in tiles of 64:
// k_nope and v of the head and the shared k_rope, by cp.async into two buffers (tile t - 1 loads
// while tile t is computed; one barrier a tile). Shared rows are padded by 16 bytes (400 and 272
// bytes: 16 mod 128), so the 8 rows an ldmatrix reads fall in distinct banks. Per tile and warp:
//   S = Q K^T     12 k16 steps x 8 n8 tiles (K fragments by ldmatrix from key-major rows);
//   mask          only on tiles that cross a row's causal limit or the block's end (at most 3
//                 of a 128-row tile's diagonal, plus the block's partial last tile);
//   softmax       running max (log2 units) and per-thread partial sums, exp2 via ex2.approx;
//   O += P V      the S accumulators, rounded to bf16, are the A fragments (no shared memory);
//                 V fragments by ldmatrix.trans; 4 k16 steps x 16 n8 tiles.
// Key tiles run from the last visible one down (the masked tiles first); query tiles from the
// last (the most keys under causality) so the longest blocks start first. Fully masked tiles are
// never loaded: a block's tiles end at its last row's last visible key. 222 registers, no spills;
// 134 KB of shared memory: one block a multiprocessor.
//
// Measured on the H200 (tests/gpu/mla_expanded_cuda_bench.cc; H = 32, bf16 output; two runs,
// 2026-12-04): 268-273 TFLOP/s at T = 8192 fresh, 279-281 at T = 16384 fresh, 274-275 at
// T = 8192 after 122880 keys in 8 blocks of 16384 (a 1M-token prefill's steady state), 27-28% of
// the 989 TFLOP/s dense bf16 peak. Peers in the same run (tests/gpu/mla_expanded_peer.py):
// PyTorch's SDPA flash backend (FlashAttention-2, v padded to 192) 245 / 261 / 268, cuDNN's fused
// attention (Hopper kernels) 568 / 632 / 338. Tried and slower: skipping O's rescale when every
// factor of a warp's rows is exactly 1 (244-253: the vote and branch cost more than the 64
// multiplies), and 4-warp blocks of 64 rows, two a multiprocessor (185-193: twice the K/V
// traffic per FLOP). What is left to gain lies on Hopper's own path (what cuDNN takes): wgmma
// with K and V read from shared memory by the tensor cores (here each 16-row warp reads the whole
// K and V tile through ldmatrix), TMA copies, and warpgroups that overlap one's softmax with
// another's products.
#include <cuda_bf16.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mla_expanded_launch.h"
#include "kernels/cuda/mma_sync.cuh"

namespace loom::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kBM = 16 * kWarps;  // query rows per block
constexpr int kBN = 64;           // keys per tile

template <int DN, int DR, int DV>
struct Tile {
  static constexpr int DK = DN + DR;      // q/k dims
  static constexpr int KSTEPS = DK / 16;  // k16 steps of Q K^T
  static constexpr int KROW = DK + 8;     // Q and K row stride in shared memory (bf16)
  static constexpr int VROW = DV + 8;     // V row stride
  static constexpr int SNT = kBN / 8;     // n8 score tiles
  static constexpr int ONT = DV / 8;      // n8 output tiles
  static constexpr int Q_ELEMS = kBM * KROW;
  static constexpr int K_ELEMS = kBN * KROW;
  static constexpr int V_ELEMS = kBN * VROW;
  static constexpr int BYTES = (Q_ELEMS + 2 * K_ELEMS + 2 * V_ELEMS) * 2;
  // Loads: kThreads / kBN threads a key row, kThreads / kBM a query row.
  static_assert(kThreads % kBN == 0 && kThreads % kBM == 0 && (DN / 8) % (kThreads / kBN) == 0 &&
                    (DR / 8) % (kThreads / kBN) == 0 && (DV / 8) % (kThreads / kBN) == 0 &&
                    (DK / 8) % (kThreads / kBM) == 0,
                "load mapping");
  static_assert(DN % 32 == 0 && DR % 32 == 0 && DV % 32 == 0 && DK % 16 == 0, "head dims");
};

// A row's last visible key relative to a tile, clamped into [-1, kBN].
__device__ __forceinline__ int clamp_col(int64_t d) {
  return static_cast<int>(d < -1 ? -1 : (d > kBN ? kBN : d));
}
// 2^x (ex2.approx: ~2 ulp; 2^-inf = 0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

template <int DN, int DR, int DV>
__global__ void __launch_bounds__(kThreads, 1)
    mla_expanded_kernel(const launch::MlaExpandedArgs a, int n_qtiles) {
  using C = Tile<DN, DR, DV>;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t q_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));  // [kBM][KROW]
  const uint32_t k_s = q_s + C::Q_ELEMS * 2;      // [2][kBN][KROW]: [k_nope | k_rope]
  const uint32_t v_s = k_s + 2 * C::K_ELEMS * 2;  // [2][kBN][VROW]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, c4 = lane & 3;
  const int H = a.H;
  const int qt = n_qtiles - 1 - static_cast<int>(blockIdx.x) / H;
  const int h = static_cast<int>(blockIdx.x) % H;
  const int r0 = qt * kBM;
  const int rend = min(r0 + kBM, a.T);
  // Row i sees the block's keys j <= off + i (and j < nk).
  const int64_t off = a.past - a.key0;
  const int64_t jmax = min(off + rend - 1, a.nk - 1);  // the last row's last key
  const int64_t jfirst = min(off + r0, a.nk - 1);      // the first row's last key
  const int n_tiles = jmax < 0 ? 0 : static_cast<int>(jmax / kBN) + 1;
  const int n_full = jfirst < 0 ? 0 : static_cast<int>((jfirst + 1) / kBN);  // unmasked tiles
  if (n_tiles == 0 && !a.first && !a.last) return;  // no key of this block: the state stays

  const bf16* q = static_cast<const bf16*>(a.q);
  const bf16* kv = static_cast<const bf16*>(a.kv);
  const bf16* rope = static_cast<const bf16*>(a.k_rope);

  // Q tile: kThreads / kBM = 2 threads a row, rows past T zero-filled.
  {
    constexpr int TPR = kThreads / kBM;
    const int row = tid / TPR, part = tid % TPR;
    const int r = r0 + row;
    const bool ok = r < a.T;
    const bf16* src =
        q + (ok ? static_cast<int64_t>(r) * a.q_row + static_cast<int64_t>(h) * C::DK : 0);
    const uint32_t dst = q_s + row * C::KROW * 2;
#pragma unroll
    for (int i = 0; i < C::DK / 8 / TPR; ++i) {
      const int c = part + TPR * i;
      cp_async16(dst + c * 16, src + c * 8, ok);
    }
  }
  cp_commit();

  // Key tile t into buffer t & 1: kThreads / kBN threads a key (pieces part + TPR i), keys past
  // nk zero-filled (their weight is 0 and must not meet a non-finite value in P V).
  auto load_tile = [&](int t) {
    constexpr int TPR = kThreads / kBN;
    const int row = tid / TPR, part = tid % TPR;
    const int64_t j = static_cast<int64_t>(t) * kBN + row;
    const bool ok = j < a.nk;
    const int64_t jj = ok ? j : 0;
    const bf16* kn = kv + jj * a.kv_row + static_cast<int64_t>(h) * (DN + DV);
    const bf16* kr = rope + jj * a.rope_row;
    const uint32_t kd = k_s + ((t & 1) * C::K_ELEMS + row * C::KROW) * 2;
    const uint32_t vd = v_s + ((t & 1) * C::V_ELEMS + row * C::VROW) * 2;
#pragma unroll
    for (int i = 0; i < DN / 8 / TPR; ++i) {
      const int c = part + TPR * i;
      cp_async16(kd + c * 16, kn + c * 8, ok);
    }
#pragma unroll
    for (int i = 0; i < DR / 8 / TPR; ++i) {
      const int c = part + TPR * i;
      cp_async16(kd + DN * 2 + c * 16, kr + c * 8, ok);
    }
#pragma unroll
    for (int i = 0; i < DV / 8 / TPR; ++i) {
      const int c = part + TPR * i;
      cp_async16(vd + c * 16, kn + DN + c * 8, ok);
    }
  };
  if (n_tiles > 0) load_tile(n_tiles - 1);
  cp_commit();

  // Running state of rows lo = r0 + 16 warp + g and hi = lo + 8: max (log2 units, the same in
  // the 4 threads of a row) and this thread's partial sum over its columns.
  const int row_lo = r0 + warp * 16 + g, row_hi = row_lo + 8;
  const bool lo_ok = row_lo < a.T, hi_ok = row_hi < a.T;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;
  float o[C::ONT][4];
#pragma unroll
  for (int n = 0; n < C::ONT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  if (!a.first) {
    const int64_t slo = static_cast<int64_t>(row_lo) * H + h, shi = slo + 8 * H;
    if (lo_ok) {
      m_lo = a.ml[2 * slo];
      l_lo = c4 == 0 ? a.ml[2 * slo + 1] : 0.0f;
      const float* p = a.acc + slo * DV + 2 * c4;
#pragma unroll
      for (int n = 0; n < C::ONT; ++n) {
        const float2 v = *reinterpret_cast<const float2*>(p + n * 8);
        o[n][0] = v.x;
        o[n][1] = v.y;
      }
    }
    if (hi_ok) {
      m_hi = a.ml[2 * shi];
      l_hi = c4 == 0 ? a.ml[2 * shi + 1] : 0.0f;
      const float* p = a.acc + shi * DV + 2 * c4;
#pragma unroll
      for (int n = 0; n < C::ONT; ++n) {
        const float2 v = *reinterpret_cast<const float2*>(p + n * 8);
        o[n][2] = v.x;
        o[n][3] = v.y;
      }
    }
  }
  // Last visible key of each row (block-relative), for the masked tiles.
  const int64_t lim_lo = min(off + row_lo, a.nk - 1), lim_hi = min(off + row_hi, a.nk - 1);

  // Q fragments (A operand, rows of this warp), once.
  uint32_t qf[C::KSTEPS][4];
  cp_wait<1>();
  __syncthreads();
  {
    const uint32_t base = q_s + ((warp * 16 + (lane & 15)) * C::KROW + (lane >> 4) * 8) * 2;
#pragma unroll
    for (int kq = 0; kq < C::KSTEPS; ++kq) ldsm4(qf[kq], base + kq * 32);
  }

  const float sl = a.scale * 1.4426950408889634f;  // scores to log2 units
  // ldmatrix lane offsets: K (non-transposed, B of Q K^T) and V (transposed, B of P V).
  const uint32_t k_lane =
      k_s + (((lane & 7) + ((lane >> 4) << 3)) * C::KROW + ((lane >> 3) & 1) * 8) * 2;
  const uint32_t v_lane =
      v_s + (((lane & 7) + (((lane >> 3) & 1) << 3)) * C::VROW + ((lane >> 4) << 3)) * 2;

  for (int t = n_tiles - 1; t >= 0; --t) {
    cp_wait<0>();
    __syncthreads();  // tile t visible; every warp is done with tile t + 1's buffer
    if (t > 0) load_tile(t - 1);
    cp_commit();

    float s[C::SNT][4];
#pragma unroll
    for (int n = 0; n < C::SNT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    {
      const uint32_t kb = k_lane + (t & 1) * C::K_ELEMS * 2;
#pragma unroll
      for (int kq = 0; kq < C::KSTEPS; ++kq) {
#pragma unroll
        for (int np = 0; np < C::SNT / 2; ++np) {
          uint32_t b[4];
          ldsm4(b, kb + (np * 16 * C::KROW + kq * 16) * 2);
          mma16816(s[2 * np], qf[kq], b[0], b[1]);
          mma16816(s[2 * np + 1], qf[kq], b[2], b[3]);
        }
      }
    }
    if (t >= n_full) {  // some key of this tile lies past some row's limit
      const int64_t kt = static_cast<int64_t>(t) * kBN;
      const int dlo = clamp_col(lim_lo - kt), dhi = clamp_col(lim_hi - kt);
#pragma unroll
      for (int n = 0; n < C::SNT; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = n * 8 + 2 * c4 + e;
          if (col > dlo) s[n][e] = -INFINITY;
          if (col > dhi) s[n][2 + e] = -INFINITY;
        }
      }
    }

    // Online softmax (scale > 0, so the raw maximum is the scaled one's).
    float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
    for (int n = 0; n < C::SNT; ++n) {
      mx_lo = fmaxf(mx_lo, fmaxf(s[n][0], s[n][1]));
      mx_hi = fmaxf(mx_hi, fmaxf(s[n][2], s[n][3]));
    }
    mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 1));
    mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 1));
    mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 2));
    mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 2));
    const float mn_lo = fmaxf(m_lo, mx_lo * sl), mn_hi = fmaxf(m_hi, mx_hi * sl);
    // A row with no visible key yet keeps max -inf; its weights are exp2(-inf) = 0.
    const float base_lo = mn_lo == -INFINITY ? 0.0f : mn_lo;
    const float base_hi = mn_hi == -INFINITY ? 0.0f : mn_hi;
    const float al_lo = fast_exp2(m_lo - base_lo), al_hi = fast_exp2(m_hi - base_hi);
    m_lo = mn_lo;
    m_hi = mn_hi;
    float rs_lo = 0.0f, rs_hi = 0.0f;
#pragma unroll
    for (int n = 0; n < C::SNT; ++n) {
      s[n][0] = fast_exp2(fmaf(s[n][0], sl, -base_lo));
      s[n][1] = fast_exp2(fmaf(s[n][1], sl, -base_lo));
      s[n][2] = fast_exp2(fmaf(s[n][2], sl, -base_hi));
      s[n][3] = fast_exp2(fmaf(s[n][3], sl, -base_hi));
      rs_lo += s[n][0] + s[n][1];
      rs_hi += s[n][2] + s[n][3];
    }
    l_lo = fmaf(l_lo, al_lo, rs_lo);
    l_hi = fmaf(l_hi, al_hi, rs_hi);
#pragma unroll
    for (int n = 0; n < C::ONT; ++n) {
      o[n][0] *= al_lo;
      o[n][1] *= al_lo;
      o[n][2] *= al_hi;
      o[n][3] *= al_hi;
    }

    // O += P V: the score accumulators of n8 tiles 2 kk, 2 kk + 1 are the A fragment of k16
    // step kk.
    {
      const uint32_t vb = v_lane + (t & 1) * C::V_ELEMS * 2;
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) {
        uint32_t pa[4];
        pa[0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
        pa[1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
        pa[2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        pa[3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
        for (int np = 0; np < C::ONT / 2; ++np) {
          uint32_t b[4];
          ldsm4t(b, vb + (kk * 16 * C::VROW + np * 16) * 2);
          mma16816(o[2 * np], pa, b[0], b[1]);
          mma16816(o[2 * np + 1], pa, b[2], b[3]);
        }
      }
    }
  }
  cp_wait<0>();

  l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 1);
  l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 1);
  l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 2);
  l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 2);

#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = half ? row_hi : row_lo;
    if (row >= a.T) continue;
    const float l = half ? l_hi : l_lo;
    const int64_t slot = static_cast<int64_t>(row) * H + h;
    if (a.last) {
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      const int64_t at = static_cast<int64_t>(row) * a.out_row + static_cast<int64_t>(h) * DV;
      if (a.out_f32) {
        float* dst = static_cast<float*>(a.out) + at + 2 * c4;
#pragma unroll
        for (int n = 0; n < C::ONT; ++n) {
          *reinterpret_cast<float2*>(dst + n * 8) =
              make_float2(o[n][2 * half] * inv, o[n][2 * half + 1] * inv);
        }
      } else {
        bf16* dst = static_cast<bf16*>(a.out) + at + 2 * c4;
#pragma unroll
        for (int n = 0; n < C::ONT; ++n) {
          *reinterpret_cast<__nv_bfloat162*>(dst + n * 8) =
              __floats2bfloat162_rn(o[n][2 * half] * inv, o[n][2 * half + 1] * inv);
        }
      }
    } else {
      float* dst = a.acc + slot * DV + 2 * c4;
#pragma unroll
      for (int n = 0; n < C::ONT; ++n) {
        *reinterpret_cast<float2*>(dst + n * 8) = make_float2(o[n][2 * half], o[n][2 * half + 1]);
      }
      if (c4 == 0) {
        *reinterpret_cast<float2*>(a.ml + 2 * slot) = make_float2(half ? m_hi : m_lo, l);
      }
    }
  }
}

#define MLA_EXPANDED_REQUIRE(cond, ...)                                            \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      std::fprintf(stderr, "%s:%d: mla_expanded_attention: ", __FILE__, __LINE__); \
      std::fprintf(stderr, __VA_ARGS__);                                           \
      std::fprintf(stderr, "\n");                                                  \
      std::abort();                                                                \
    }                                                                              \
  } while (0)

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <int DN, int DR, int DV>
void launch_expanded(cudaStream_t stream, const launch::MlaExpandedArgs& a) {
  using C = Tile<DN, DR, DV>;
  auto kernel = mla_expanded_kernel<DN, DR, DV>;
  // The dynamic shared-memory limit, raised once per device (64 devices at most).
  static std::atomic<uint64_t> raised{0};
  int dev = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = uint64_t{1} << (dev & 63);
  if (!(raised.load(std::memory_order_relaxed) & bit)) {
    LOOM_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::BYTES));
    LOOM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                         cudaSharedmemCarveoutMaxShared));
    raised.fetch_or(bit, std::memory_order_relaxed);
  }
  const int n_qtiles = (a.T + kBM - 1) / kBM;
  const int64_t blocks = static_cast<int64_t>(n_qtiles) * a.H;
  LOOM_CHECK_GRID(blocks);
  kernel<<<static_cast<unsigned>(blocks), kThreads, C::BYTES, stream>>>(a, n_qtiles);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace

namespace launch {

bool mla_expanded_supported(int dn, int dr, int dv) { return dn == 128 && dr == 64 && dv == 128; }

void mla_expanded_attention(cudaStream_t stream, const MlaExpandedArgs& a) {
  MLA_EXPANDED_REQUIRE(mla_expanded_supported(a.dn, a.dr, a.dv),
                       "head dims (dn %d, dr %d, dv %d) not supported (only 128, 64, 128)", a.dn,
                       a.dr, a.dv);
  MLA_EXPANDED_REQUIRE(a.T >= 0 && a.H > 0 && a.nk >= 0 && a.nk < (int64_t{1} << 31),
                       "bad sizes T %d, H %d, nk %lld", a.T, a.H, static_cast<long long>(a.nk));
  MLA_EXPANDED_REQUIRE(a.past >= 0 && a.key0 >= 0, "negative past %lld or key0 %lld",
                       static_cast<long long>(a.past), static_cast<long long>(a.key0));
  MLA_EXPANDED_REQUIRE(a.scale > 0.0f && std::isfinite(a.scale), "scale %g must be positive",
                       a.scale);
  // An empty first block that is not also the last would leave the state uninitialised for the
  // next launch to read.
  MLA_EXPANDED_REQUIRE(a.nk > 0 || !a.first || a.last,
                       "an empty first key block (nk 0) must also be the last");
  if (a.T == 0) return;
  if (a.nk == 0 && (a.first || !a.last)) return;
  MLA_EXPANDED_REQUIRE(aligned16(a.q) && aligned16(a.kv) && aligned16(a.k_rope),
                       "q %p, kv %p and k_rope %p must be 16-byte aligned", a.q, a.kv, a.k_rope);
  MLA_EXPANDED_REQUIRE(a.q_row % 8 == 0 && a.kv_row % 8 == 0 && a.rope_row % 8 == 0,
                       "row strides q %lld, kv %lld, rope %lld must be multiples of 8 elements",
                       static_cast<long long>(a.q_row), static_cast<long long>(a.kv_row),
                       static_cast<long long>(a.rope_row));
  MLA_EXPANDED_REQUIRE(
      a.q_row >= static_cast<int64_t>(a.H) * (a.dn + a.dr) &&
          a.kv_row >= static_cast<int64_t>(a.H) * (a.dn + a.dv) && a.rope_row >= a.dr,
      "row strides q %lld, kv %lld, rope %lld shorter than a row", static_cast<long long>(a.q_row),
      static_cast<long long>(a.kv_row), static_cast<long long>(a.rope_row));
  if (!(a.first && a.last)) {
    MLA_EXPANDED_REQUIRE(a.acc != nullptr && a.ml != nullptr && aligned16(a.acc) && aligned16(a.ml),
                         "acc %p and ml %p must be 16-byte aligned device arrays across blocks",
                         static_cast<void*>(a.acc), static_cast<void*>(a.ml));
  }
  if (a.last) {
    MLA_EXPANDED_REQUIRE(a.out != nullptr && aligned16(a.out) && a.out_row % 8 == 0 &&
                             a.out_row >= static_cast<int64_t>(a.H) * a.dv,
                         "out %p must be 16-byte aligned with a row stride (%lld) a multiple of "
                         "8 elements and at least H * dv",
                         a.out, static_cast<long long>(a.out_row));
  }
  launch_expanded<128, 64, 128>(stream, a);
}

}  // namespace launch
}  // namespace loom::cuda
