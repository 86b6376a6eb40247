// MLA attention in absorbed form over a bf16 paged cache on tensor cores (mma.sync m16n8k16, bf16
// operands, f32 accumulation): the decode kernel of mla_attention_varlen (kernels/cuda/
// attention.cc maps queries into the latent space first and back after).
//
// Shapes: latent R = 512 and rope 64 (the DeepSeek-V2/V3 and Kimi layouts); every head reads the
// same cache row [latent | rope] (576 bf16), so a work unit takes 32 heads of one query row at
// once (two m16 tiles; fewer heads are zero rows, more take several units) and reads its keys
// once for all of them: 64 key scores per 1152 cache bytes and head, which is why CUDA cores
// (about 60 FLOP per cache byte at 32 heads) cannot keep up with the memory here.
//
// Per tile of BN keys (cp.async, ST tiles in flight; a row of 576 + 8 bf16, so the 8 rows an
// ldmatrix reads fall in distinct banks):
//   scores  S[32 x BN] = Q K^T: warp w takes m16 tile (w & 1) and a quarter of the 576 dims
//           (w >> 1), its Q fragments held in registers for the whole unit; the four quarter
//           sums meet in shared memory and are added in a fixed order;
//   softmax eight threads per head row: mask, running max and sum (log2 units), P to shared
//           memory as bf16, the rescale factor beside it;
//   values  O[32 x 512] += P V with V the latent part of the same tile (ldmatrix.trans); warp w
//           owns columns [64 w, 64 w + 64) of both m tiles (64 accumulators a thread).
// Three barriers a tile. Precision: q is rounded to bf16 for the products and so are the
// probabilities (flash-attention's usual choice); sums, softmax state and outputs stay f32.
//
// Row invariance: as in attention_simt.cu, a row's result depends only on its own q, keys and
// split (the unit is one row; tiles start at the split's first key; masked keys weigh exactly 0).
//
// Measured on the H200 (tests/gpu/attention_cuda_bench.cc, 2026-12-01): 2.2-2.4 TB/s of cache at
// batch 64 and contexts 32K-128K, 54-56% of the device copy, not the 80% aimed at. Its probes
// show why: the arithmetic alone runs at 77% of the copy rate (one block of 8 warps a
// multiprocessor, three barriers a tile: latency-bound), the loads alone at 69% (one 74 KB tile
// in flight a multiprocessor), and the two overlap only partly. Shuffled or ordered pages make no
// difference. Tried and slower: 32-key tiles with 3-4 buffers (more in flight, more barriers a
// key), and a software-pipelined loop (P V of tile i - 1 beside the scores of tile i, two
// barriers a tile; loads 80%, arithmetic 64%). What should reach the copy rate is Hopper's own
// path, as FlashMLA takes it: TMA bulk copies into an mbarrier pipeline fed by a producer warp,
// and wgmma with the keys read from shared memory by the tensor cores. That is
// attention_mla_wgmma.cu, the default on the H200 where pages hold whole key tiles (1.3-1.45x
// this kernel's rate); this one stays for other page sizes and as AttentionTuning::mla_path 2.
//
// FP8 pools (AttnArgs::kv_fp8, kernels/attention.h's format; 64-key tiles, two buffers): a row
// is 516 + 68 bytes, only 4-byte aligned, so neither cp.async's 16-byte copies nor TMA boxes fit
// it, and the bytes change on the way anyway. Each warp loads 8 rows of the next tile into
// registers (a lane four latent words and a rope or scale word) while the block computes this
// one, and after the tile's barrier widens them, f32(code) * scale rounded to bf16, into the free
// key buffer: the same three barriers a tile, the MMAs unchanged, half the cache bytes read. On
// the H200 fp8 pools take attention_mla_wgmma.cu's fp8 variant where pages hold whole 64-key
// tiles (1.1-1.2x this kernel); this one stays for other page sizes and devices.
#include <cuda_bf16.h>

#include <cmath>
#include <type_traits>

#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kv_fp8.cuh"
#include "kernels/cuda/mma_sync.cuh"

namespace loom::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 256;
constexpr int kHeads = 32;  // query heads per unit: two m16 tiles

template <int DL, int DR, int BN, int ST>
struct Tc {
  static constexpr int DK = DL + DR;
  static constexpr int KSTEPS = DK / 16;
  static constexpr int SLICE = KSTEPS / 4;   // k16 steps of one warp's quarter of the dims
  static constexpr int ROW = DK + 8;         // key row stride (bf16): 16 bytes mod 128
  static constexpr int NT = BN / 8;          // n8 score tiles per key tile
  static constexpr int SROW = BN + 4;        // quarter-score row stride (f32)
  static constexpr int PROW = BN + 8;        // probability row stride (bf16)
  static constexpr int CHUNKS = DK / 8;      // 16-byte pieces of a key row
  static constexpr int TPK = kThreads / BN;  // threads loading one key row
  static constexpr int PER = CHUNKS / TPK;   // pieces per thread
  static constexpr int COLS = DL / 8;        // value columns per warp
  static constexpr int VNT = COLS / 8;       // n8 value tiles per warp
  static constexpr size_t K_BYTES = static_cast<size_t>(ST) * BN * ROW * 2;
  static constexpr size_t S_BYTES = static_cast<size_t>(4) * kHeads * SROW * 4;
  static constexpr size_t P_BYTES = static_cast<size_t>(kHeads) * PROW * 2;
  static constexpr size_t BYTES = K_BYTES + S_BYTES + P_BYTES + 3 * kHeads * 4;
  static_assert(KSTEPS % 4 == 0 && CHUNKS % TPK == 0 && COLS % 16 == 0 && BN % 32 == 0 &&
                    NT % 2 == 0 && DL % 8 == 0,
                "tile shapes");
};

template <int DL, int DR, int BN, int ST, bool F8 = false>
__global__ void __launch_bounds__(kThreads, 1) mla_tc_kernel(const launch::AttnArgs a) {
  using C = Tc<DL, DR, BN, ST>;
  static_assert(!F8 || (DL == 512 && DR == 64 && BN == 64 && ST == 2), "fp8 tiles");
  constexpr int kF8Rows = BN / 8;  // fp8: key rows each warp loads a tile
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* k_s = reinterpret_cast<bf16*>(smem);                            // [ST][BN][ROW]
  float* s_s = reinterpret_cast<float*>(smem + C::K_BYTES);             // [4][kHeads][SROW]
  bf16* p_s = reinterpret_cast<bf16*>(smem + C::K_BYTES + C::S_BYTES);  // [kHeads][PROW]
  float* alpha_s = reinterpret_cast<float*>(smem + C::K_BYTES + C::S_BYTES + C::P_BYTES);
  float* m_s = alpha_s + kHeads;
  float* l_s = m_s + kHeads;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, c4 = lane & 3;
  const int mw = warp & 1, ksl = warp >> 1;           // scores: m16 tile, quarter of the dims
  const int sq = tid >> 3, ssub = tid & 7;            // softmax: head row, eighth of the keys
  const int kk = tid / C::TPK, kpart = tid % C::TPK;  // loads: key row, piece offset
  const int H = a.heads;
  const int htiles = (H + kHeads - 1) / kHeads;
  const int64_t total = static_cast<int64_t>(a.sched.counts[0]) * htiles;
  const float sl = a.scale * 1.4426950408889634f;
  const bf16* latent = static_cast<const bf16*>(a.k1);
  const bf16* rope = static_cast<const bf16*>(a.k2);
  // Zero the key tiles once: rows past a unit's keys are never loaded, and their weight 0 must
  // not meet a non-finite value (uninitialised shared memory) in P V. Later units leave finite
  // cache rows behind.
  for (int i = tid; i < static_cast<int>(C::K_BYTES / 16); i += kThreads)
    reinterpret_cast<uint4*>(smem)[i] = make_uint4(0u, 0u, 0u, 0u);

  for (int64_t u = blockIdx.x; u < total; u += gridDim.x) {
    const int4 it = reinterpret_cast<const int4*>(a.sched.items)[u / htiles];
    const int h0 = static_cast<int>(u % htiles) * kHeads;
    const int seq = it.x, split = it.w;
    const int64_t row = it.y;
    const int64_t chunk = a.sched.seq_chunk[seq];
    const int64_t L = a.past[seq] + (row - a.cu[seq]) + 1;
    const int64_t kb = chunk > 0 ? split * chunk : 0;
    const int64_t ke = chunk > 0 ? min(L, kb + chunk) : L;
    const int ntiles = static_cast<int>((ke - kb + BN - 1) / BN);

    // This warp's Q fragments: heads h0 + 16 mw + (g, g + 8), dims of its quarter.
    uint32_t qf[C::SLICE][4];
    {
      const float* qr = static_cast<const float*>(a.q) + row * a.q_row;
      const int hlo = h0 + mw * 16 + g, hhi = hlo + 8;
#pragma unroll
      for (int kq = 0; kq < C::SLICE; ++kq) {
        const int d0 = (ksl * C::SLICE + kq) * 16 + 2 * c4;
        float2 x0 = make_float2(0.0f, 0.0f), x1 = x0, x2 = x0, x3 = x0;
        if (hlo < H) {
          const float* p = qr + static_cast<int64_t>(hlo) * a.q_head + d0;
          x0 = *reinterpret_cast<const float2*>(p);
          x2 = *reinterpret_cast<const float2*>(p + 8);
        }
        if (hhi < H) {
          const float* p = qr + static_cast<int64_t>(hhi) * a.q_head + d0;
          x1 = *reinterpret_cast<const float2*>(p);
          x3 = *reinterpret_cast<const float2*>(p + 8);
        }
        qf[kq][0] = pack_bf16(x0.x, x0.y);
        qf[kq][1] = pack_bf16(x1.x, x1.y);
        qf[kq][2] = pack_bf16(x2.x, x2.y);
        qf[kq][3] = pack_bf16(x3.x, x3.y);
      }
    }

    auto pool_row = [&](int t) -> int64_t {
      const int64_t pos = kb + static_cast<int64_t>(t) * BN + kk;
      if (t >= ntiles || pos >= ke) return -1;
      // 32-bit division: positions and page sizes fit (checked on the host); 64-bit division
      // is a long instruction sequence on the GPU, paid per thread and tile.
      const uint32_t p32 = static_cast<uint32_t>(pos), ps32 = static_cast<uint32_t>(a.page_size);
      const uint32_t page = p32 / ps32;
      const int64_t pid = a.page_table[seq * a.max_pages + page];
      if (pid < 0 || pid >= a.num_pages) return -1;
      return pid * a.page_size + (p32 - page * ps32);
    };
    auto issue = [&](int t, int64_t prow) {
      if (prow < 0 || (a.probe == 1 && t >= ST - 1)) return;
      bf16* dst = k_s + ((t % ST) * BN + kk) * C::ROW;
      const bf16* ls = latent + prow * a.k1_row;
      const bf16* rs = rope + prow * a.k2_row;
#pragma unroll
      for (int i = 0; i < C::PER; ++i) {
        const int ch = kpart + C::TPK * i;
        if (ch < DL / 8) {
          cp_async16(dst + ch * 8, ls + ch * 8);
        } else {
          cp_async16(dst + DL + (ch - DL / 8) * 8, rs + (ch - DL / 8) * 8);
        }
      }
    };

    // fp8: tile t's rows through registers. Warp w takes keys w + 8 rr; a lane the latent words
    // lane + 32 k, and in x a rope word (lanes 0-15), the latent scale (16) or the rope scale
    // (17). A key outside the range loads zeros (a finite row for its weight 0).
    uint32_t f8_lat[F8 ? kF8Rows : 1][4];
    uint32_t f8_x[F8 ? kF8Rows : 1];
    auto f8_load = [&](int t) {
      if constexpr (F8) {
#pragma unroll
        for (int rr = 0; rr < kF8Rows; ++rr) {
          const int64_t pos = kb + static_cast<int64_t>(t) * BN + warp + 8 * rr;
          int64_t prow = -1;
          if (t < ntiles && pos < ke) {
            const uint32_t p32 = static_cast<uint32_t>(pos),
                           ps32 = static_cast<uint32_t>(a.page_size);
            const uint32_t page = p32 / ps32;
            const int64_t pid = a.page_table[seq * a.max_pages + page];
            if (pid >= 0 && pid < a.num_pages) prow = pid * a.page_size + (p32 - page * ps32);
          }
          if (prow < 0) {
            f8_lat[rr][0] = f8_lat[rr][1] = f8_lat[rr][2] = f8_lat[rr][3] = f8_x[rr] = 0u;
            continue;
          }
          const uint32_t* lw = reinterpret_cast<const uint32_t*>(
              static_cast<const unsigned char*>(a.k1) + prow * a.k1_row);
          const uint32_t* rw = reinterpret_cast<const uint32_t*>(
              static_cast<const unsigned char*>(a.k2) + prow * a.k2_row);
#pragma unroll
          for (int k = 0; k < 4; ++k) f8_lat[rr][k] = lw[lane + 32 * k];
          f8_x[rr] = lane < DR / 4 ? rw[lane]
                     : lane == 16  ? lw[DL / 4]
                     : lane == 17  ? rw[DR / 4]
                                   : 0u;
        }
      }
    };
    auto f8_store = [&](int t) {
      if constexpr (F8) {
        bf16* base = k_s + (t % ST) * BN * C::ROW;
#pragma unroll
        for (int rr = 0; rr < kF8Rows; ++rr) {
          const float sl = __shfl_sync(0xffffffffu, __uint_as_float(f8_x[rr]), 16);
          const float sr = __shfl_sync(0xffffffffu, __uint_as_float(f8_x[rr]), 17);
          bf16* dst = base + (warp + 8 * rr) * C::ROW;
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const float4 f = dev::kv_fp8_word(f8_lat[rr][k], sl);
            *reinterpret_cast<uint2*>(dst + 4 * (lane + 32 * k)) =
                make_uint2(pack_bf16(f.x, f.y), pack_bf16(f.z, f.w));
          }
          if (lane < DR / 4) {
            const float4 f = dev::kv_fp8_word(f8_x[rr], sr);
            *reinterpret_cast<uint2*>(dst + DL + 4 * lane) =
                make_uint2(pack_bf16(f.x, f.y), pack_bf16(f.z, f.w));
          }
        }
      }
    };

    float m_run = -INFINITY, l_run = 0.0f;
    float acc[2][C::VNT][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int n = 0; n < C::VNT; ++n)
        acc[mt][n][0] = acc[mt][n][1] = acc[mt][n][2] = acc[mt][n][3] = 0.0f;
    }

    __syncthreads();  // the previous unit is done with every buffer
    int64_t pre = -1;
    if constexpr (F8) {
      f8_load(0);
      f8_store(0);
      f8_load(1);
    } else {
#pragma unroll
      for (int t = 0; t < ST - 1; ++t) {
        issue(t, pool_row(t));
        cp_commit();
      }
      pre = pool_row(ST - 1);
    }

    for (int i = 0; i < ntiles; ++i) {
      if constexpr (F8) {
        __syncthreads();  // tile i visible; every warp is done with tile i - 1's buffer
        if (i + 1 < ntiles) f8_store(i + 1);
        if (i + 2 < ntiles) f8_load(i + 2);
      } else {
        cp_wait<ST - 2>();
        __syncthreads();  // tile i visible; every warp is done with tile i - 1
        issue(i + ST - 1, pre);
        cp_commit();
        pre = pool_row(i + ST);
      }
      const bf16* ks = k_s + (i % ST) * BN * C::ROW;
      if (a.probe == 2) {  // benchmarks: the loads and barriers alone
        __syncthreads();
        __syncthreads();
        continue;
      }

      // Quarter scores of this warp's m tile.
      float sacc[C::NT][4];
#pragma unroll
      for (int n = 0; n < C::NT; ++n) sacc[n][0] = sacc[n][1] = sacc[n][2] = sacc[n][3] = 0.0f;
#pragma unroll
      for (int kq = 0; kq < C::SLICE; ++kq) {
        const int dim = (ksl * C::SLICE + kq) * 16 + (((lane >> 3) & 1) << 3);
#pragma unroll
        for (int np = 0; np < C::NT / 2; ++np) {
          uint32_t b[4];
          const int key = np * 16 + (lane & 7) + ((lane >> 4) << 3);
          ldsm4(b, ks + key * C::ROW + dim);
          mma16816(sacc[2 * np], qf[kq], b[0], b[1]);
          mma16816(sacc[2 * np + 1], qf[kq], b[2], b[3]);
        }
      }
      {
        float* sw = s_s + (ksl * kHeads + mw * 16) * C::SROW;
#pragma unroll
        for (int n = 0; n < C::NT; ++n) {
          const int col = n * 8 + 2 * c4;
          *reinterpret_cast<float2*>(sw + g * C::SROW + col) = make_float2(sacc[n][0], sacc[n][1]);
          *reinterpret_cast<float2*>(sw + (g + 8) * C::SROW + col) =
              make_float2(sacc[n][2], sacc[n][3]);
        }
      }
      __syncthreads();

      // Softmax of head row sq over keys 4 ssub + 32 uu + e.
      {
        float x[BN / 32][4];
        float mt = -INFINITY;
#pragma unroll
        for (int uu = 0; uu < BN / 32; ++uu) {
          const int j = 4 * ssub + 32 * uu;
          float4 t = *reinterpret_cast<const float4*>(s_s + sq * C::SROW + j);
#pragma unroll
          for (int q4 = 1; q4 < 4; ++q4) {
            const float4 v =
                *reinterpret_cast<const float4*>(s_s + (q4 * kHeads + sq) * C::SROW + j);
            t.x += v.x;
            t.y += v.y;
            t.z += v.z;
            t.w += v.w;
          }
          const int64_t pos = kb + static_cast<int64_t>(i) * BN + j;
          x[uu][0] = pos < ke ? t.x * sl : -INFINITY;
          x[uu][1] = pos + 1 < ke ? t.y * sl : -INFINITY;
          x[uu][2] = pos + 2 < ke ? t.z * sl : -INFINITY;
          x[uu][3] = pos + 3 < ke ? t.w * sl : -INFINITY;
#pragma unroll
          for (int e = 0; e < 4; ++e) mt = fmaxf(mt, x[uu][e]);
        }
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 4));
        const float mn = fmaxf(m_run, mt);
        const float base = mn == -INFINITY ? 0.0f : mn;
        const float alpha = exp2f(m_run - base);
        float rs = 0.0f;
#pragma unroll
        for (int uu = 0; uu < BN / 32; ++uu) {
          float p[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            p[e] = exp2f(x[uu][e] - base);
            rs += p[e];
          }
          uint2 w;
          w.x = pack_bf16(p[0], p[1]);
          w.y = pack_bf16(p[2], p[3]);
          *reinterpret_cast<uint2*>(p_s + sq * C::PROW + 4 * ssub + 32 * uu) = w;
        }
        rs += __shfl_xor_sync(0xffffffffu, rs, 1);
        rs += __shfl_xor_sync(0xffffffffu, rs, 2);
        rs += __shfl_xor_sync(0xffffffffu, rs, 4);
        l_run = fmaf(l_run, alpha, rs);
        m_run = mn;
        if (ssub == 0) alpha_s[sq] = alpha;
      }
      __syncthreads();

      // O = alpha O + P V over this warp's 64 value columns.
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const float alo = alpha_s[mt * 16 + g], ahi = alpha_s[mt * 16 + g + 8];
        // Once a row's max settles its factor is exactly 1: skip the multiplications (exact).
        if (!__any_sync(0xffffffffu, alo != 1.0f || ahi != 1.0f)) continue;
#pragma unroll
        for (int n = 0; n < C::VNT; ++n) {
          acc[mt][n][0] *= alo;
          acc[mt][n][1] *= alo;
          acc[mt][n][2] *= ahi;
          acc[mt][n][3] *= ahi;
        }
      }
#pragma unroll
      for (int kq = 0; kq < BN / 16; ++kq) {
        uint32_t pa[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
          ldsm4(pa[mt], p_s + (mt * 16 + (lane & 15)) * C::PROW + kq * 16 + ((lane >> 4) << 3));
        const int key = kq * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
        for (int np = 0; np < C::VNT / 2; ++np) {
          uint32_t b[4];
          ldsm4t(b, ks + key * C::ROW + warp * C::COLS + np * 16 + ((lane >> 4) << 3));
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            mma16816(acc[mt][2 * np], pa[mt], b[0], b[1]);
            mma16816(acc[mt][2 * np + 1], pa[mt], b[2], b[3]);
          }
        }
      }
    }
    cp_wait<0>();

    if (ssub == 0) {
      m_s[sq] = m_run;
      l_s[sq] = l_run;
    }
    __syncthreads();
    const int ns = a.sched.row_nsplit[row];
    const int64_t slot = ns > 1 ? static_cast<int64_t>(a.sched.row_part[row]) + split : 0;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int hl = mt * 16 + g + 8 * half, head = h0 + hl;
        if (head >= H) continue;
        float* dst;
        if (ns <= 1) {
          dst = static_cast<float*>(a.o) + row * a.o_row + static_cast<int64_t>(head) * a.o_head;
        } else {
          dst = a.part_acc + (slot * H + head) * DL;
        }
        const float den = l_s[hl];
#pragma unroll
        for (int n = 0; n < C::VNT; ++n) {
          const int col = warp * C::COLS + n * 8 + 2 * c4;
          float v0 = acc[mt][n][2 * half], v1 = acc[mt][n][2 * half + 1];
          if (ns <= 1) {
            v0 /= den;
            v1 /= den;
          }
          *reinterpret_cast<float2*>(dst + col) = make_float2(v0, v1);
        }
      }
    }
    if (ns > 1 && tid < kHeads && h0 + tid < H) {
      a.part_ml[(slot * H + h0 + tid) * 2] = m_s[tid];
      a.part_ml[(slot * H + h0 + tid) * 2 + 1] = l_s[tid];
    }
  }
}

template <int BN, int ST, bool F8 = false>
void launch_tc(cudaStream_t stream, const launch::AttnArgs& a, int64_t max_items) {
  using C = Tc<512, 64, BN, ST>;
  auto kernel = mla_tc_kernel<512, 64, BN, ST, F8>;
  const int64_t htiles = (a.heads + kHeads - 1) / kHeads;
  int64_t blocks = max_items * htiles;
  const int64_t cap =
      launch::resident_blocks(reinterpret_cast<const void*>(kernel), kThreads, C::BYTES);
  if (blocks > cap) blocks = cap;
  if (blocks < 1) return;
  kernel<<<static_cast<unsigned>(blocks), kThreads, C::BYTES, stream>>>(a);
  LOOM_CUDA_CHECK_LAUNCH();
}

bool aligned(const void* p, size_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; }

}  // namespace

namespace launch {

bool mla_tc_supported(const AttnArgs& a) {
  if (a.kv_fp8) {  // whole words: rows of 516 and 68 bytes
    return a.d1 == 512 && a.d2 == 64 && a.dv == 512 && a.v == nullptr && a.groups == 1 &&
           a.k2 != nullptr && !a.q_bf16 && !a.o_bf16 && aligned(a.k1, 4) && aligned(a.k2, 4) &&
           a.k1_row % 4 == 0 && a.k2_row % 4 == 0 && aligned(a.q, 8) && a.q_row % 2 == 0 &&
           a.q_head % 2 == 0 && aligned(a.o, 8) && a.o_row % 2 == 0 && a.o_head % 2 == 0;
  }
  return a.kv_bf16 && a.d1 == 512 && a.d2 == 64 && a.dv == 512 && a.v == nullptr && a.groups == 1 &&
         !a.q_bf16 && !a.o_bf16 && aligned(a.k1, 16) && aligned(a.k2, 16) &&
         (a.k1_row * 2) % 16 == 0 && (a.k2_row * 2) % 16 == 0 && aligned(a.q, 8) &&
         a.q_row % 2 == 0 && a.q_head % 2 == 0 && aligned(a.o, 8) && a.o_row % 2 == 0 &&
         a.o_head % 2 == 0;
}

void mla_attn_tc(cudaStream_t stream, const AttnArgs& a, int64_t max_items, int bn, int stages) {
  if (a.kv_fp8) return launch_tc<64, 2, true>(stream, a, max_items);  // its one tile shape
  if (bn == 32 && stages == 4) return launch_tc<32, 4>(stream, a, max_items);
  if (bn == 32 && stages == 3) return launch_tc<32, 3>(stream, a, max_items);
  return launch_tc<64, 2>(stream, a, max_items);
}

int64_t mla_tc_resident(int bn, int stages, bool fp8) {
  if (fp8)
    return resident_blocks(reinterpret_cast<const void*>(mla_tc_kernel<512, 64, 64, 2, true>),
                           kThreads, Tc<512, 64, 64, 2>::BYTES);
  auto blocks = [](auto bn_c, auto st_c) {
    constexpr int BN = decltype(bn_c)::value, ST = decltype(st_c)::value;
    return resident_blocks(reinterpret_cast<const void*>(mla_tc_kernel<512, 64, BN, ST>), kThreads,
                           Tc<512, 64, BN, ST>::BYTES);
  };
  using I32 = std::integral_constant<int, 32>;
  if (bn == 32 && stages == 4) return blocks(I32{}, std::integral_constant<int, 4>{});
  if (bn == 32 && stages == 3) return blocks(I32{}, std::integral_constant<int, 3>{});
  return blocks(std::integral_constant<int, 64>{}, std::integral_constant<int, 2>{});
}

}  // namespace launch
}  // namespace loom::cuda
