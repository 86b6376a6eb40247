// The block-scaled FP8 grouped GEMM of the grouped SwiGLU with stored FP8 expert weights
// (MoeGemmPath::kWgmmaFp8, sm_90a; launcher in kernels/cuda/moe_fp8_launch.h, the SwiGLU around it
// in kernels/cuda/moe_fp8.cu). DeepSeek-V3's recipe, as DeepGEMM runs it: activations are e4m3
// with one f32 scale per row and 128 columns (launch::quantize_fp8_groups), weights e4m3 with one
// f32 scale per 128 x 128 block (core/fp8_matrix.h), and
//   out[r, n] = sum_kb sa[kb, r] * sb[n / 128, kb] * (sum_{k in block kb} f32(a[r, k]) f32(b[n,
//   k]))
// with the inner sum on the FP8 tensor cores (wgmma m64n128k32 e4m3 x e4m3 -> f32, one 128-deep
// block at a time, started from zero) and the outer one in an f32 accumulator: each block's sum is
// promoted with its own two scales, so the scales are applied exactly where the reference's
// dequantization puts them and the tensor cores' limited accumulation precision (about 14 bits,
// DeepSeek-V3 report 3.3.2) spans 128 products at most.
//
// Structure (the house kernel, kernels/cuda/moe_gemm.cu's ws namespace, on e4m3): persistent
// clusters of two CTAs, 384 threads each. Warpgroup 0 produces: warp 0's one thread fills a
// 4-stage ring with TMA (128-byte swizzle; a stage is the A tile of 128 rows x 128 k and the B
// tile of 256 rows x 128 k, B split in two 128-row halves that each CTA of the cluster copies one
// of and multicasts to both), warp 1 copies the stage's scales (the A tile's 128 row scales and
// the two halves' block scales) with 4-byte cp.async that arrive on the same barrier. Warpgroups 1
// and 2 multiply rows 0-63 and 64-127 of the CTA's tile: per stage, half 0 then half 1, each four
// wgmma m64n128k32 into a 64-register partial sum, waited for, then added into the half's f32
// accumulator times sa * sb (the other warpgroup's wgmma run meanwhile). A full m64n256 partial
// would need 128 more registers than the 232 a consumer thread has (DeepGEMM's limit too); the
// halves read the A tile twice from shared memory instead. Each half of B is one 128-row scale
// block: gate/up pairs W_gate's and W_up's rows n0 .. n0 + 127 (so g and u of a column sit in the
// same thread, as on the bf16 path), down takes rows n0 .. n0 + 255 of W_down.
//
// Epilogues: down stores y (f32 pairs, or bf16 in 16-byte pieces after a transpose across each
// quad of lanes). Gate/up computes h = silu(g) * u and quantizes it as the down GEMM's A operand
// in registers: a tile holds 128 whole columns of I (one scale group) of each of its rows, a row's
// 128 values sit in four lanes of one warp, so the group's amax is two shuffles; s = amax / 448 (1
// for an all-zero group) as launch::quantize_fp8_groups has it, q = e4m3(h * (448 / amax)) rounded
// to nearest even and saturated (the quantizer divides by s instead: the two quotients differ by
// an f32 ulp or so, e4m3 keeps 3 bits). g and u are stored f32 when gate_up is asked for.
//
// The tile schedule: both producer warps search the offsets for each cluster tile (find_tile);
// the scale warp writes the tile into its first stage's side data, so the consumers never search
// (between two tiles they go straight from the epilogue to the next tile's first stage), and a
// last stage with expert -1 ends them.
//
// Bounds and masking: rows past the expert's end or past R, k past K and B rows past N load what
// TMA gives (zeros out of bounds, else other experts' rows) and reach only outputs that are never
// stored; columns past N are left out of h's amax. A warpgroup whose 64 rows are all past the
// expert's end skips its wgmma, still releasing the stages. Needs K % 16 == 0 and N % 16 == 0 (TMA
// row strides of whole 16-byte pieces; h's 2-byte stores) and 16-byte aligned tensors.
//
// Measured on an H200 (tests/gpu/moe_fp8_cuda_bench.cc, the 48B shape E 256, D 2304, I 1024,
// top-8, bf16 x and y; the run's cuBLASLt plain FP8 GEMM at 8192^3: 1464 TFLOP/s): the two GEMMs
// together 904 TFLOP/s (0.62 of it) at 4096 rows per expert, 774 (0.53) at 512, 458 (0.31) at 128
// (a cluster tile's second 128 rows empty); gate/up and down alike (0.62 / 0.62 at 4096 rows).
// The first version searched the offsets in every consumer warp between tiles and stored bf16 y
// in 4-byte pieces: 0.48 / 0.35 there. Under ncu (gate/up, 512 rows per expert) this one keeps
// the tensor pipe 48% of its theoretical peak busy with 0.47 eligible warps a scheduler
// (latency-bound: L2 55%, DRAM 26%). What is left: the epilogues still stall both consumer
// warpgroups (nothing overlaps them: a ping-pong of the two warpgroups over two tiles, as
// CUTLASS's, needs a second accumulator set), and below 256 rows per expert the cluster's two row
// tiles go half empty (sharing A instead of B would fill them).
//
// Batch invariance: an output element is the same sequence of operations on its row of A and
// its expert's weights whatever else the call holds (fixed k-block order, the tensor core's fixed
// order within a block, no split-K), and h's scale depends on the row only: a row alone gives the
// same bits as in any batch on this path. kAuto picks the path by the row count, so
// batch-invariant mode never picks it (kernels/cuda/moe_fp8.cu).
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cfloat>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe_fp8_launch.h"
#include "kernels/cuda/moe_gemm_common.cuh"
#include "kernels/cuda/tma_pipeline.cuh"

namespace loom::cuda {
namespace {

using moe_gemm::bf16;
using moe_gemm::find_tile;
using moe_gemm::GemmParams;
using moe_gemm::smem_addr;
using moe_gemm::store_out;
using moe_gemm::Tile;

namespace bs {

constexpr int BM = 128;     // rows of a CTA's tile (two consumer warpgroups of 64)
constexpr int BN = 256;     // B rows of a tile: two halves of one 128-row scale block each
constexpr int kHalf = 128;  // B rows per half
constexpr int BK = 128;     // k per stage: one scale block, 128 bytes of e4m3 per row
constexpr int kStages = 4, kThreads = 384, kCluster = 2;
constexpr int kAStage = BM * BK, kBHalf = kHalf * BK;  // bytes
constexpr int kStageBytes = kAStage + 2 * kBHalf;      // 48 KiB
// A stage's side data: the A tile's BM row scales, half 0's and half 1's block scales, 2 spare,
// then (in a tile's first stage) the tile as int4 {expert, first row, the expert's end, cluster
// tile}, expert -1 for the end of the launch's tiles.
constexpr int kScaleFloats = BM + 8, kTileSlot = BM + 4;
static_assert(kTileSlot % 4 == 0 && kScaleFloats % 4 == 0, "16-byte aligned int4 tile slots");
// The 1024-byte aligned ring, the scales, then a full and an empty barrier per stage.
constexpr size_t kSmem =
    1024 + kStages * kStageBytes + kStages * kScaleFloats * 4 + 2 * kStages * 8;
static_assert(kSmem <= 227 * 1024, "one CTA per SM");

// Scale pointers of one launch (the operands themselves come through the tensor maps).
struct Scales {
  const float* a = nullptr;   // [ceil(K / 128), R]
  const float* b0 = nullptr;  // [E, ceil(N / 128), ceil(K / 128)]
  const float* b1 = nullptr;  // gate/up: W_up's
  float* h = nullptr;         // gate/up: h's, [ceil(N / 128), R]
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LOOM_MOE_FP8_WGMMA 1

constexpr float kE4m3Max = 448.0f;  // e4m3fn's largest finite value: a group's amax maps to it

using tma::cluster_rank;
using tma::cluster_sync;
using tma::fence_operands;
using tma::mbar_arrive_cluster;
using tma::mbar_expect_tx;
using tma::mbar_init;
using tma::mbar_wait;
using tma::sw128_desc;
using tma::tma_load;
using tma::tma_load_multicast;

// d = A B^T (accumulate = 0) or d += A B^T for one warpgroup: A 64 x 32 and B 128 x 32 e4m3
// (K-major, 128-byte swizzle) in shared memory; d the m64n128 f32 fragment.
__device__ __forceinline__ void wgmma_k32(float (&d)[64], uint64_t da, uint64_t db,
                                          int accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "l"(da), "l"(db), "r"(accumulate));
}

// One 128-deep block of a half: part = A (64 x 128) B_half^T (128 x 128), on the tensor cores,
// waited for.
__device__ __forceinline__ void block_product(float (&part)[64], uint64_t da, uint64_t db) {
  fence_operands(part);
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
  for (int k32 = 0; k32 < BK / 32; ++k32) wgmma_k32(part, da + 2 * k32, db + 2 * k32, k32);
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  fence_operands(part);
}

// acc += part * scale of its row: fragment element 4 j + q is row g + 8 (q >> 1) of the warp's
// 16 (lane 4 g + c), column 8 j + 2 c + (q & 1).
__device__ __forceinline__ void promote(float (&acc)[64], const float (&part)[64], float s_lo,
                                        float s_hi) {
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    acc[4 * j] = fmaf(part[4 * j], s_lo, acc[4 * j]);
    acc[4 * j + 1] = fmaf(part[4 * j + 1], s_lo, acc[4 * j + 1]);
    acc[4 * j + 2] = fmaf(part[4 * j + 2], s_hi, acc[4 * j + 2]);
    acc[4 * j + 3] = fmaf(part[4 * j + 3], s_hi, acc[4 * j + 3]);
  }
}

__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
}
// The barrier's arrival once every cp.async this thread issued so far has landed (counted in the
// barrier's expected arrivals: .noinc).
__device__ __forceinline__ void cp_async_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// The bf16 pairs w[t] (columns 8 (4 q + t) + 2 c, + 1 of one row, lane 4 g + c) transposed across
// the four lanes of the quad: afterwards lane c holds the 16 bytes of columns 8 (4 q + c) .. + 7
// in w[0..3]. Two butterfly rounds.
__device__ __forceinline__ void quad_transpose(uint32_t (&w)[4], int c) {
  const bool odd = c & 1, high = c & 2;
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    const uint32_t got = __shfl_xor_sync(moe_gemm::kFull, odd ? w[2 * q] : w[2 * q + 1], 1);
    if (odd) {
      w[2 * q] = got;
    } else {
      w[2 * q + 1] = got;
    }
  }
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    const uint32_t got = __shfl_xor_sync(moe_gemm::kFull, high ? w[q] : w[2 + q], 2);
    if (high) {
      w[q] = got;
    } else {
      w[2 + q] = got;
    }
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// Gate/up (kDual): p.b0 / p.b1 are W_gate / W_up, N = I, outputs h (p.h: e4m3 [R, N]; sc.h its
// scales) and p.gate_up; tiles of 128 columns of I. Down: p.b0 = W_down, N = D, output p.y; tiles
// of 256 columns of D. Cluster tiles go (row-tile group, column tile), column tile fastest, as in
// the bf16 kernel, so the clusters working at one time share A rows and a few experts' weights in
// L2; a cluster tile is two row tiles of one expert (find_tile with 2 BM rows).
template <bool kDual>
__global__ void __launch_bounds__(kThreads, 1)
    kernel(const __grid_constant__ CUtensorMap ta, const __grid_constant__ CUtensorMap tb0,
           const __grid_constant__ CUtensorMap tb1, GemmParams p, Scales sc) {
#if defined(LOOM_MOE_FP8_WGMMA)
  extern __shared__ __align__(1024) unsigned char bs_smem[];
  const uint32_t base = smem_addr(bs_smem);
  const uint32_t ring = (base + 1023) & ~1023u;
  const uint32_t scales0 = ring + kStages * kStageBytes;
  const uint32_t full0 = scales0 + kStages * kScaleFloats * 4, empty0 = full0 + kStages * 8;
  float* scale_ring = reinterpret_cast<float*>(bs_smem + (scales0 - base));
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const uint32_t rank = cluster_rank();
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      // The TMA thread's arrive (+ the bytes), the scale warp's 32 cp.async arrivals and its
      // lane 0's arrive (after the tile slot's store).
      mbar_init(full0 + 8 * s, 1 + 32 + 1);
      mbar_init(empty0 + 8 * s, 8 * kCluster);  // every consumer warp of the cluster
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  cluster_sync();  // the peer's barriers are initialised before anything reaches them
  const int clusters = static_cast<int>(gridDim.x) / kCluster;
  const int first = static_cast<int>(blockIdx.x) / kCluster, rows = BM * kCluster;
  const int KT = (p.K + BK - 1) / BK;         // k blocks (B's scale columns)
  const int gn = (p.N + kHalf - 1) / kHalf;   // B's scale rows per expert
  constexpr int kTileN = kDual ? kHalf : BN;  // columns of N per tile

  if (warp < 4) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (warp == 0) {
      int s = 0;
      uint32_t ph = 0;
      for (int ct = first;; ct += clusters) {
        const Tile t = find_tile(p.off, p.E, p.R, ct / p.ntn, rows);
        if (t.e < 0) {  // the end stage: no bytes, the scale warp's tile slot says so
          if (lane == 0) {
            mbar_wait(empty0 + 8 * s, ph ^ 1);
            mbar_arrive(full0 + 8 * s);
          }
          break;
        }
        const int arow = t.row0 + BM * static_cast<int>(rank);
        const int brow = t.e * p.N + (ct % p.ntn) * kTileN;
        if (lane == 0) {
          for (int kt = 0; kt < KT; ++kt) {
            const uint32_t full = full0 + 8 * s, sa = ring + s * kStageBytes, sb = sa + kAStage;
            mbar_wait(empty0 + 8 * s, ph ^ 1);
            mbar_expect_tx(full, kStageBytes);
            tma_load(sa, &ta, kt * BK, arow, full);  // A: this CTA's rows
            // B half `rank` into both CTAs: W_gate's or W_up's rows n0.. (gate/up), or W_down's
            // rows n0 + 128 rank.. (down).
            tma_load_multicast(sb + rank * kBHalf, kDual && rank ? &tb1 : &tb0, kt * BK,
                               brow + (kDual ? 0 : static_cast<int>(rank) * kHalf), full,
                               (1u << kCluster) - 1);
            if (++s == kStages) {
              s = 0;
              ph ^= 1;
            }
          }
        }
        __syncwarp();
      }
    } else if (warp == 1) {
      int s = 0;
      uint32_t ph = 0;
      // The consumers learn each tile from its first stage's tile slot (so they never search the
      // offsets themselves), and the end from a last stage with expert -1.
      const auto put_tile = [&](int4 v) {
        *reinterpret_cast<int4*>(scale_ring + s * kScaleFloats + kTileSlot) = v;
      };
      for (int ct = first;; ct += clusters) {
        const Tile t = find_tile(p.off, p.E, p.R, ct / p.ntn, rows);
        if (t.e < 0) {
          mbar_wait(empty0 + 8 * s, ph ^ 1);
          if (lane == 0) put_tile(make_int4(-1, 0, 0, 0));
          cp_async_arrive(full0 + 8 * s);  // nothing in flight: at once
          if (lane == 0) mbar_arrive(full0 + 8 * s);
          break;
        }
        const int arow = t.row0 + BM * static_cast<int>(rank);
        const int nb = (ct % p.ntn) * kTileN / kHalf;  // the tile's first 128-row block of N
        // Half 1 of a down tile may lie past N (its outputs are never stored): clamped.
        const int64_t e_rows = static_cast<int64_t>(t.e) * gn;
        const float* b_lo = sc.b0 + (e_rows + nb) * KT;
        const float* b_hi =
            kDual ? sc.b1 + (e_rows + nb) * KT : sc.b0 + (e_rows + min(nb + 1, gn - 1)) * KT;
        for (int kt = 0; kt < KT; ++kt) {
          mbar_wait(empty0 + 8 * s, ph ^ 1);
          const uint32_t dst = scales0 + s * kScaleFloats * 4;
          const float* src = sc.a + static_cast<int64_t>(kt) * p.R;
#pragma unroll
          for (int i = lane; i < BM; i += 32) {
            const int row = arow + i;
            cp_async4(dst + 4 * i, src + (row < p.R ? row : 0), row < p.R);
          }
          if (lane < 2) cp_async4(dst + 4 * (BM + lane), (lane ? b_hi : b_lo) + kt, true);
          if (kt == 0 && lane == 0) put_tile(make_int4(t.e, t.row0, t.row_end, ct));
          cp_async_arrive(full0 + 8 * s);
          if (lane == 0) mbar_arrive(full0 + 8 * s);  // releases the tile slot's store
          if (++s == kStages) {
            s = 0;
            ph ^= 1;
          }
        }
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const int w = (warp >> 2) - 1;  // rows 64 w.. of the CTA's tile
    const int g = lane >> 2, c = lane & 3;
    const int lrow = 64 * w + 16 * (warp & 3) + g;  // this thread's first row in the CTA's tile
    int s = 0;
    uint32_t ph = 0;
    float acc[2][64], part[64];
    for (;;) {
      mbar_wait(full0 + 8 * s, ph);  // the tile's first stage, with the tile
      const int4 tile = *reinterpret_cast<const int4*>(scale_ring + s * kScaleFloats + kTileSlot);
      if (tile.x < 0) break;
      const int row_end = tile.z, n0 = (tile.w % p.ntn) * kTileN;
      const int r0 = tile.y + BM * static_cast<int>(rank) + 64 * w;
      const bool busy = r0 < row_end;
      const bool hi_live = kDual || n0 + kHalf < p.N;  // half 1 holds stored columns
#pragma unroll
      for (int i = 0; i < 64; ++i) acc[0][i] = acc[1][i] = 0.0f;
      for (int kt = 0; kt < KT; ++kt) {
        if (kt > 0) mbar_wait(full0 + 8 * s, ph);
        if (busy) {
          const float* ss = scale_ring + s * kScaleFloats;
          const float sa_lo = ss[lrow], sa_hi = ss[lrow + 8];
          const float sb_lo = ss[BM], sb_hi = ss[BM + 1];
          const uint32_t st = ring + s * kStageBytes;
          const uint64_t da = sw128_desc(st + w * 64 * 128);
          const uint64_t db = sw128_desc(st + kAStage);
          block_product(part, da, db);
          promote(acc[0], part, sa_lo * sb_lo, sa_hi * sb_lo);
          if (hi_live) {
            block_product(part, da, db + (kBHalf >> 4));
            promote(acc[1], part, sa_lo * sb_hi, sa_hi * sb_hi);
          }
        }
        __syncwarp();  // every lane is done with the stage's tiles and scales
        if (lane == 0) {
#pragma unroll
          for (int cta = 0; cta < kCluster; ++cta) mbar_arrive_cluster(empty0 + 8 * s, cta);
        }
        if (++s == kStages) {
          s = 0;
          ph ^= 1;
        }
      }
      if (!busy) continue;

      const int row_a = r0 + 16 * (warp & 3) + g;  // rows row_a and row_a + 8
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int row = row_a + 8 * hf;
        if constexpr (kDual) {
          // h = silu(g) * u of the row's 128 columns n0.. (32 here, 32 in each of the lanes
          // 4 g + c'), quantized with the group's scale; columns past N count as 0. h / s as h
          // times the reciprocal of s, silu's quotient with __fdividef: each within a few f32
          // ulps, far below e4m3's 2^-4.
          float hv[32];
          float amax = 0.0f;
#pragma unroll
          for (int j = 0; j < 16; ++j) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int col = n0 + 8 * j + 2 * c + e;
              const float gv = acc[0][4 * j + 2 * hf + e], uv = acc[1][4 * j + 2 * hf + e];
              hv[2 * j + e] = col < p.N ? __fdividef(gv, 1.0f + expf(-gv)) * uv : 0.0f;
              amax = fmaxf(amax, fabsf(hv[2 * j + e]));
            }
          }
          amax = fmaxf(amax, __shfl_xor_sync(moe_gemm::kFull, amax, 1));
          amax = fmaxf(amax, __shfl_xor_sync(moe_gemm::kFull, amax, 2));
          const bool zero = !(amax > 0.0f);
          const float scale = zero ? 1.0f : amax / kE4m3Max;
          const float inv = zero ? 1.0f : kE4m3Max / amax;
          // 448 / amax overflows below amax = 448 / FLT_MAX (~1.3e-36): there h / scale, as the
          // quantizer computes everywhere (inf would make 0 * inf = NaN codes).
          const bool divide = !(inv <= FLT_MAX);
          if (row >= row_end) continue;
          const int64_t i0 = static_cast<int64_t>(row) * p.N;
          uint8_t* hq = static_cast<uint8_t*>(p.h) + i0;
#pragma unroll
          for (int j = 0; j < 16; ++j) {
            const int col = n0 + 8 * j + 2 * c;
            if (col >= p.N) continue;  // N even: the pair is in or out together
            const float2 qv = divide ? make_float2(hv[2 * j] / scale, hv[2 * j + 1] / scale)
                                     : make_float2(hv[2 * j] * inv, hv[2 * j + 1] * inv);
            *reinterpret_cast<uint16_t*>(hq + col) =
                static_cast<uint16_t>(__nv_cvt_float2_to_fp8x2(qv, __NV_SATFINITE, __NV_E4M3));
            if (p.gate_up) {
              float* gu = p.gate_up + i0 + col;
              *reinterpret_cast<float2*>(gu) =
                  make_float2(acc[0][4 * j + 2 * hf], acc[0][4 * j + 2 * hf + 1]);
              *reinterpret_cast<float2*>(gu + static_cast<int64_t>(p.R) * p.N) =
                  make_float2(acc[1][4 * j + 2 * hf], acc[1][4 * j + 2 * hf + 1]);
            }
          }
          if (c == 0) sc.h[static_cast<int64_t>(n0 / kHalf) * p.R + row] = scale;
        } else if (p.y_bf16) {
          // 16-byte stores: the quad's bf16 pairs of four column blocks transposed so that lane c
          // stores block 4 q + c whole (every lane takes part: row and column checks after).
#pragma unroll
          for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              uint32_t wv[4];
#pragma unroll
              for (int t = 0; t < 4; ++t) {
                const int j = 4 * q + t;
                wv[t] = moe_gemm::pack_bf16(acc[h][4 * j + 2 * hf], acc[h][4 * j + 2 * hf + 1]);
              }
              quad_transpose(wv, c);
              const int col = n0 + kHalf * h + 8 * (4 * q + c);
              if (row < row_end && col < p.N) {
                *reinterpret_cast<uint4*>(static_cast<bf16*>(p.y) +
                                          static_cast<int64_t>(row) * p.N + col) =
                    make_uint4(wv[0], wv[1], wv[2], wv[3]);
              }
            }
          }
        } else {
          if (row >= row_end) continue;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int j = 0; j < 16; ++j) {
              const int col = n0 + kHalf * h + 8 * j + 2 * c;
              if (col >= p.N) continue;
              const float v[2] = {acc[h][4 * j + 2 * hf], acc[h][4 * j + 2 * hf + 1]};
              store_out<false, 2, bf16>(p, row, col, v, v);
            }
          }
        }
      }
    }
  }
  // No CTA may leave while its peer can still arrive on its barriers or copy into it.
  cluster_sync();
#else
  __trap();  // compiled for a device without wgmma: never launched (moe_fp8_block_gemm_supported)
#endif
}

}  // namespace bs

// ---- host side ---------------------------------------------------------------------------------

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// A row-major e4m3 matrix [rows, k] read in boxes of 128 k x 128 rows, 128-byte swizzled (the
// layout tma::sw128_desc describes). k % 16 == 0 (rows of whole 16-byte pieces).
CUtensorMap fp8_tensor_map(const void* base, int64_t rows, int64_t k) {
  CUtensorMap m;
  const cuuint64_t kk = static_cast<cuuint64_t>(std::max<int64_t>(k, 16));
  const cuuint64_t dims[2] = {kk, static_cast<cuuint64_t>(std::max<int64_t>(rows, 1))};
  const cuuint64_t strides[1] = {kk};
  const cuuint32_t box[2] = {bs::BK, bs::BM};
  const cuuint32_t unit[2] = {1, 1};
  const CUresult r = tma::tensor_map_encoder()(
      &m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides, box, unit,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) tma::fail("cuTensorMapEncodeTiled", static_cast<int>(r));
  return m;
}

// One GEMM: a persistent grid of as many clusters as fit, or fewer when there are fewer cluster
// tiles (sum_e ceil(n_e / (2 BM)) <= ceil(R / (2 BM)) + E).
template <bool kDual>
void launch_gemm(cudaStream_t stream, GemmParams p, const bs::Scales& sc, const CUtensorMap& ta,
                 const CUtensorMap& tb0, const CUtensorMap& tb1) {
  constexpr int kCluster = bs::kCluster, kTileN = kDual ? bs::kHalf : bs::BN;
  const auto kernel = bs::kernel<kDual>;
  static std::atomic<uint64_t> smem_done{0};
  static std::atomic<int> clusters_cache[64];
  tma::allow_smem(kernel, bs::kSmem, smem_done);
  p.ntn = (p.N + kTileN - 1) / kTileN;
  if (p.ntn == 0) return;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kCluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(kCluster);
  cfg.blockDim = dim3(bs::kThreads);
  cfg.dynamicSmemBytes = bs::kSmem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  const int64_t rows = int64_t{bs::BM} * kCluster;
  const int64_t tiles = ((p.R + rows - 1) / rows + p.E) * p.ntn;
  const int64_t clusters = std::min(tiles, tma::resident_clusters(kernel, cfg, clusters_cache));
  cfg.gridDim = dim3(static_cast<unsigned>(clusters * kCluster));
  LOOM_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, ta, tb0, tb1, p, sc));
}

}  // namespace

namespace launch {

bool moe_fp8_block_gemm_supported(const MoeFp8BlockGemm& g) {
  const bool dual = g.b1 != nullptr;
  const bool outs = dual ? aligned16(g.h_q) && aligned16(g.h_scales) &&
                               (g.gate_up == nullptr || aligned16(g.gate_up))
                         : aligned16(g.out);
  return tma::device_has_wgmma() && g.K > 0 && g.K % 16 == 0 && g.N % 16 == 0 && aligned16(g.a) &&
         aligned16(g.b0) && (!dual || aligned16(g.b1)) && outs && g.R <= INT32_MAX &&
         g.E * g.N <= INT32_MAX;
}

void moe_fp8_block_gemm(cudaStream_t stream, const MoeFp8BlockGemm& g) {
  if (g.R == 0 || g.E == 0 || g.N == 0) return;
  GemmParams p;
  p.a = g.a;
  p.b0 = g.b0;
  p.b1 = g.b1;
  p.off = g.offsets;
  p.E = static_cast<int>(g.E);
  p.R = static_cast<int>(g.R);
  p.N = static_cast<int>(g.N);
  p.K = static_cast<int>(g.K);
  bs::Scales sc;
  sc.a = g.a_scales;
  sc.b0 = g.s0;
  sc.b1 = g.s1;
  const CUtensorMap ta = fp8_tensor_map(g.a, g.R, g.K);
  const CUtensorMap tb0 = fp8_tensor_map(g.b0, g.E * g.N, g.K);
  if (g.b1 != nullptr) {
    p.h = g.h_q;
    p.gate_up = g.gate_up;
    sc.h = g.h_scales;
    launch_gemm<true>(stream, p, sc, ta, tb0, fp8_tensor_map(g.b1, g.E * g.N, g.K));
  } else {
    p.y = g.out;
    p.y_bf16 = g.out_bf16;
    launch_gemm<false>(stream, p, sc, ta, tb0, tb0);
  }
}

}  // namespace launch
}  // namespace loom::cuda
