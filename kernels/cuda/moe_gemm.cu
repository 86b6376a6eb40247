// The grouped SwiGLU of kernels/moe.h on the GPU: for every owned expert e, the rows
// [offsets[e], offsets[e + 1]) of x go through y = down_e(silu(gate_e x) * up_e x).
//
// Two launches (three on the tensor-core paths with f32 x), none reading the offsets on the host:
//   0. (tensor cores, f32 x) x's kept rows, rows [0, offsets[E]), are rounded to bf16 (scratch);
//      a bf16 x is read as it is, by cp.async or TMA, with no pass of its own;
//   1. gate/up: per (expert, row tile, column tile of I), g = x W_gate^T and u = x W_up^T for the
//      same columns of I side by side, then h = silu(g) * u into scratch (bf16 for the tensor
//      cores, f32 on the SIMT path), g and u into gate_up when asked;
//   2. down: per (expert, row tile, column tile of D), y = h W_down^T, stored f32 or rounded to
//      bf16 (round to nearest even) in the epilogue.
// x and y are f32 or bf16 each (the model's activations are bf16); the arithmetic is f32 on the
// SIMT path (a bf16 x widened on load) and bf16 x f32-accumulated on the tensor cores.
// Tiles are found on the device: find_tile turns a row-tile slot into (expert, first row, the
// expert's end) from the offsets (a warp-wide scan of the experts' tile counts, 32 experts at a
// time); sum_e ceil(n_e / BM) <= ceil(R / BM) + E bounds the slots from host-known sizes. Tiles
// of one row-tile slot are adjacent in launch (or loop) order, so its rows are read from HBM once
// and reused from L2 across its column tiles.
//
// Paths (launch::MoeGemmPath):
//   kSimt: f32 FMA, 64 x 64 tiles, 4 x 4 outputs per thread, weights and x f32 or bf16
//     (widened), any D and I; h stays f32: the CPU twin's arithmetic but for the summation order. A
//     block per (slot, column tile); blocks past the last tile return at once.
//   kMma: bf16 mma.sync m16n8k16 with f32 accumulation, 128 x 128 block tiles of 8 warps (64 x 32
//     each), k tiles of 32 in a 4-stage cp.async ring, ldmatrix fragments. Launched as kSimt.
//   kWgmma (sm_90a, namespace ws): bf16 wgmma m64n256k16, 128 x 256 tiles, k tiles of 64 in a
//     4-stage ring that TMA fills (128-byte swizzle) and mbarriers hand over: warpgroup 0's one
//     thread copies, warpgroups 1 and 2 multiply, each stage released as soon as the wgmma that
//     read it is done. Persistent (one CTA per SM, clusters loop over tiles), so a tile's first
//     k tiles load during the previous tile's last ones and its epilogue. Clusters of two CTAs
//     take two row tiles of one expert with one B tile, each CTA copying half of B to both (TMA
//     multicast): B's L2-to-SM traffic halves, 48 -> 32 KiB per k tile and CTA.
//   kWgmma128 (sm_90a, namespace wg): m64n128k16, 128 x 128 tiles of two warpgroups in a 3-stage
//     cp.async ring, two blocks per SM. Launched as kSimt.
//   kGemv (namespace gv): a warp per weight row, an expert's rows two at a time, f32 arithmetic:
//     decode shapes, where the tiles above leave most SMs idle.
// kAuto takes kGemv for aligned bf16 weights and at most kMoeGemvAutoRows rows outside
// batch-invariant mode, else kWgmma on sm_90 (else kMma) for aligned bf16 weights, kSimt otherwise.
// FP8 weights (MoeSwigluArgs::fp8) run in kernels/cuda/moe_fp8.cu.
//
// Measured on an H200 (tests/gpu/moe_cuda_bench.cc, D = 2048, I = 768, 64 experts; the run's
// cuBLAS bf16 GEMM at 8192^3: 787 TFLOP/s): kWgmma 486 / 508 / 526 TFLOP/s for the whole op at
// 512 / 1024 / 2048 rows per expert (62% / 65% / 67% of cuBLAS), 429 (54%) for a skewed routing
// of 132 to 1350 rows (512 on average; its 256-row cluster tiles span 1.27x the rows); at 512
// rows gate/up 628 (80%), down 479 (61%), the x cast 0.10 ms at 4.0 TB/s (16% of the op's 0.64
// ms). Before (a block per tile, cp.async, the same tile and wgmma): 442 / 459 / 471 / 401,
// gate/up 549, down 441 at 512 rows; the TMA kernel without clusters: 462 (59%). So the limit
// was not wave quantization (11.6 waves of 132 tiles: at most 3%) but the per-block pipeline
// fill and the L2-to-SM traffic of the 128 x 256 tile (the old gate/up moved ~6.4 TB/s from L2
// at 549 TFLOP/s; the multicast that cuts a third of it gives +5% on the op).
// bf16 x and y (the model's activations; no cast), same run as f32 x and y at 491 / 516 / 531 /
// 434: 556 / 576 / 600 / 481 TFLOP/s (70% / 73% / 76% / 61% of cuBLAS's 790). Its down GEMM
// alone is slower with bf16 y, 432 against 478 at 512 rows, though it writes half the bytes:
// each warp store then fills half of eight 32-byte sectors (the other half comes from the next
// column block's store), where f32 fills them whole; not yet measured further.
// What is left to take: with f32 x, the x cast (the only pass that is pure HBM traffic; fusing it
// needs the f32 rows converted in shared memory the 4-stage ring leaves no room for; bf16 x, the
// model's, skips it), and the down GEMM's epilogue (128 x 256 f32 y per tile with the tensor cores
// idle: a second accumulator set or ping-pong warpgroups would overlap it). The tensor-core paths
// need D and I multiples of 8 and 16-byte aligned tensors (every row a whole number of 16-byte
// pieces, as TMA and cp.async need; k tails, missing rows and columns are zero-filled or masked); x
// and h are bf16 operands, so results differ from the f32 CPU twin by bf16 rounding (~2^-9 relative
// per element; an x that is bf16 already loses nothing more). On the gate/up GEMM each thread holds
// g and u of the same (row, column) in registers (the B tile pairs W_gate and W_up rows of the same
// columns of I), so h needs no shared memory.
//
// Batch invariance: every output element is one dot product over the whole K in a fixed order
// (k tiles in order; within a tile, k ascending for SIMT, the tensor-core instruction's own fixed
// order for mma/wgmma), accumulated in registers of one thread, with no split-K and no
// reduction across blocks. Its value depends only on its row of x and the expert's weights, not
// on the other rows of the call, the row's place in its tile, or how many tiles there are; the
// path depends on dtypes, D, I and the device only. So a token's y row is the same bits alone and
// in any batch.
//
// The offsets are not checked on the host (that needs a copy back); rows are clamped to [0, R)
// so that bad offsets never reach outside x, y, gate_up or the scratch.
#include <cudaTypedefs.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/bf16_io.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe_fp8_launch.h"
#include "kernels/cuda/moe_gemm_common.cuh"
#include "kernels/cuda/moe_launch.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/pdl.h"
#include "kernels/cuda/tma_pipeline.cuh"

namespace loom::cuda {
namespace {

using moe_gemm::bf16;
using moe_gemm::cp_async16;
using moe_gemm::cp_async_commit;
using moe_gemm::cp_async_wait;
using moe_gemm::find_tile;
using moe_gemm::find_tile_block;
using moe_gemm::GemmParams;
using moe_gemm::kFull;
using moe_gemm::pack_bf16;
using moe_gemm::row_slots;
using moe_gemm::smem_addr;
using moe_gemm::store_out;
using moe_gemm::Tile;

// ---- phase 0: x's kept rows to bf16 ------------------------------------------------------------

constexpr int kCastUnroll = 4;  // float4 loads in flight per thread

__global__ void __launch_bounds__(256)
    x_to_bf16_kernel(const float* __restrict__ x, const int32_t* __restrict__ off, int E, int R,
                     int64_t D, bf16* __restrict__ xb) {
  const int64_t rows = min(max(off[E], 0), R);
  const int64_t n4 = rows * D / 4;  // D % 8 == 0
  const float4* x4 = reinterpret_cast<const float4*>(x);
  uint2* o = reinterpret_cast<uint2*>(xb);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n4;
       i += stride * kCastUnroll) {
    float4 v[kCastUnroll];
#pragma unroll
    for (int u = 0; u < kCastUnroll; ++u)
      if (i + u * stride < n4) v[u] = x4[i + u * stride];
#pragma unroll
    for (int u = 0; u < kCastUnroll; ++u)
      if (i + u * stride < n4)
        o[i + u * stride] = make_uint2(pack_bf16(v[u].x, v[u].y), pack_bf16(v[u].z, v[u].w));
  }
}

// ---- SIMT path ---------------------------------------------------------------------------------

namespace simt {

constexpr int BM = 64, BN = 64, BK = 16, kThreads = 256, LDS = BM + 4;

// Element i of a weight matrix or of x, f32 or bf16 (widened).
template <bool kBf16>
__device__ __forceinline__ float elem_at(const void* w, int64_t i) {
  if constexpr (kBf16) {
    return __bfloat162float(static_cast<const bf16*>(w)[i]);
  } else {
    return static_cast<const float*>(w)[i];
  }
}

// Thread (ty, tx) = (tid / 16, tid % 16) owns rows 4 ty.. and columns 4 tx.. of the 64 x 64 tile
// (of both g and u on the gate/up GEMM). Each output is fmaf over k = 0..K-1 in order from 0.
// kBf16: the weights' dtype; kBf16A: the A operand's (x on gate/up; h, always f32, on down).
template <bool kDual, bool kBf16, bool kBf16A>
__global__ void __launch_bounds__(kThreads) kernel(GemmParams p) {
  constexpr int NB = kDual ? 2 : 1;
  __shared__ __align__(16) float As[BK][LDS];
  __shared__ __align__(16) float Bs[NB][BK][LDS];
  const int slot = static_cast<int>(blockIdx.x / p.ntn), nt = static_cast<int>(blockIdx.x % p.ntn);
  const Tile t = find_tile(p.off, p.E, p.R, slot, BM);
  if (t.e < 0) return;
  const int n0 = nt * BN, tid = threadIdx.x, ty = tid >> 4, tx = tid & 15;
  const int64_t wbase = static_cast<int64_t>(t.e) * p.N * p.K;

  float ra[4], rb[NB][4];
  const auto load = [&](int k0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int q = tid + i * kThreads, r = q >> 4, k = k0 + (q & 15);
      const int row = t.row0 + r, col = n0 + r;
      ra[i] = row < t.row_end && k < p.K ? elem_at<kBf16A>(p.a, static_cast<int64_t>(row) * p.K + k)
                                         : 0.0f;
      const bool bok = col < p.N && k < p.K;
      const int64_t wi = wbase + static_cast<int64_t>(col) * p.K + k;
      rb[0][i] = bok ? elem_at<kBf16>(p.b0, wi) : 0.0f;
      if constexpr (kDual) rb[1][i] = bok ? elem_at<kBf16>(p.b1, wi) : 0.0f;
    }
  };
  float acc[NB][4][4] = {};
  const int KT = (p.K + BK - 1) / BK;
  if (KT > 0) load(0);
  for (int kt = 0; kt < KT; ++kt) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int q = tid + i * kThreads, r = q >> 4, k = q & 15;
      As[k][r] = ra[i];
#pragma unroll
      for (int b = 0; b < NB; ++b) Bs[b][k][r] = rb[b][i];
    }
    __syncthreads();
    if (kt + 1 < KT) load((kt + 1) * BK);
#pragma unroll
    for (int k = 0; k < BK; ++k) {
      const float4 av = *reinterpret_cast<const float4*>(&As[k][ty * 4]);
      const float ar[4] = {av.x, av.y, av.z, av.w};
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        const float4 bv = *reinterpret_cast<const float4*>(&Bs[b][k][tx * 4]);
        const float br[4] = {bv.x, bv.y, bv.z, bv.w};
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[b][i][j] = fmaf(ar[i], br[j], acc[b][i][j]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int row = t.row0 + ty * 4 + i;
    if (row >= t.row_end) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int col = n0 + tx * 4 + j;
      if (col >= p.N) continue;
      store_out<kDual, 1, float>(p, row, col, {acc[0][i][j]}, {acc[kDual ? 1 : 0][i][j]});
    }
  }
}

}  // namespace simt

// ---- B-tile rows of the tensor-core paths ------------------------------------------------------

// Tile row j of the B operand: on the gate/up GEMM, 8-row blocks alternate W_gate and W_up over
// the same columns of I (block jb: matrix jb & 1, columns n0 + 8 (jb >> 1) ..); else row n0 + j.
template <bool kDual>
__device__ __forceinline__ const bf16* b_row(const GemmParams& p, int e, int n0, int j, bool& ok) {
  int col;
  const void* w = p.b0;
  if constexpr (kDual) {
    col = n0 + (j >> 4) * 8 + (j & 7);
    if ((j >> 3) & 1) w = p.b1;
  } else {
    col = n0 + j;
  }
  ok = col < p.N;
  return static_cast<const bf16*>(w) + (static_cast<int64_t>(e) * p.N + (ok ? col : 0)) * p.K;
}

// ---- mma.sync path -----------------------------------------------------------------------------

namespace mma {

constexpr int BM = 128, BN = 128, BK = 32, kStages = 4, kThreads = 256, LDS = BK + 8;
constexpr size_t kSmem = sizeof(bf16) * kStages * (BM + BN) * LDS;  // 80 KiB

__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void ldsm4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// Warps 2 (rows) x 4 (columns), each 64 x 32: acc[mi][nj] is the m16 x n8 tile at rows
// 64 wm + 16 mi, columns 32 wn + 8 nj; lane 4 g + c holds rows g, g + 8 and columns 2c, 2c + 1.
// On the gate/up GEMM, nj = 2q (gate) and 2q + 1 (up) are columns n0 + 8 (2 wn + q) + 2c of I.
template <bool kDual>
__global__ void __launch_bounds__(kThreads, 2) kernel(GemmParams p) {
  extern __shared__ __align__(128) unsigned char mma_smem[];
  bf16* sA = reinterpret_cast<bf16*>(mma_smem);
  bf16* sB = sA + kStages * BM * LDS;
  const int slot = static_cast<int>(blockIdx.x / p.ntn), nt = static_cast<int>(blockIdx.x % p.ntn);
  const Tile t = find_tile(p.off, p.E, p.R, slot, BM);
  if (t.e < 0) return;
  const int n0 = nt * (kDual ? BN / 2 : BN);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp >> 2, wn = warp & 3;
  const bf16* a = static_cast<const bf16*>(p.a);

  // Loads: 16-byte piece kc = tid & 3 of rows (tid >> 2) + 64 i of the A and B tiles.
  const int kc = tid & 3;
  const bf16* a_src[2];
  const bf16* b_src[2];
  bool a_ok[2], b_ok[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = (tid >> 2) + 64 * i, row = t.row0 + r;
    a_ok[i] = row < t.row_end;
    a_src[i] = a + static_cast<int64_t>(a_ok[i] ? row : 0) * p.K + kc * 8;
    b_src[i] = b_row<kDual>(p, t.e, n0, r, b_ok[i]) + kc * 8;
  }
  const uint32_t sA0 = smem_addr(sA), sB0 = smem_addr(sB);
  const auto load = [&](int stage, int kt) {
    const int k = kt * BK;
    const bool k_ok = k + kc * 8 < p.K;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint32_t off = (((tid >> 2) + 64 * i) * LDS + kc * 8) * 2;
      const bool ao = a_ok[i] && k_ok, bo = b_ok[i] && k_ok;
      cp_async16(sA0 + (stage * BM * LDS) * 2 + off, ao ? a_src[i] + k : a, ao);
      cp_async16(sB0 + (stage * BN * LDS) * 2 + off, bo ? b_src[i] + k : a, bo);
    }
  };

  float acc[4][4][4] = {};
  const int KT = (p.K + BK - 1) / BK;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < KT) load(s, s);
    cp_async_commit();
  }
  // ldmatrix addresses (bytes, within a stage): A rows 64 wm + 16 mi + (lane & 15), k
  // (lane >> 4) 8; B rows 32 wn + 16 np + (lane & 7) + (lane >> 4) 8, k ((lane >> 3) & 1) 8.
  const uint32_t a_frag = ((wm * 64 + (lane & 15)) * LDS + (lane >> 4) * 8) * 2;
  const uint32_t b_frag =
      ((wn * 32 + (lane & 7) + ((lane >> 4) << 3)) * LDS + ((lane >> 3) & 1) * 8) * 2;
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile kt is in; every warp is done with the stage refilled below
    if (kt + kStages - 1 < KT) load((kt + kStages - 1) % kStages, kt + kStages - 1);
    cp_async_commit();
    const int stage = kt % kStages;
    const uint32_t As = sA0 + (stage * BM * LDS) * 2 + a_frag;
    const uint32_t Bs = sB0 + (stage * BN * LDS) * 2 + b_frag;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      uint32_t af[4][4], bfr[4][2];
#pragma unroll
      for (int mi = 0; mi < 4; ++mi) ldsm4(af[mi], As + (mi * 16 * LDS + kk) * 2);
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        uint32_t r[4];
        ldsm4(r, Bs + (np * 16 * LDS + kk) * 2);
        bfr[2 * np][0] = r[0];
        bfr[2 * np][1] = r[1];
        bfr[2 * np + 1][0] = r[2];
        bfr[2 * np + 1][1] = r[3];
      }
#pragma unroll
      for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int nj = 0; nj < 4; ++nj) mma16816(acc[mi][nj], af[mi], bfr[nj][0], bfr[nj][1]);
    }
  }
  cp_async_wait<0>();

  const int g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int row = t.row0 + wm * 64 + mi * 16 + g + hf * 8;
      if (row >= t.row_end) continue;
      if constexpr (kDual) {
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const int col = n0 + (wn * 2 + q) * 8 + 2 * c;
          if (col >= p.N) continue;
          const float(&gq)[4] = acc[mi][2 * q];
          const float(&uq)[4] = acc[mi][2 * q + 1];
          store_out<true, 2, bf16>(p, row, col, {gq[2 * hf], gq[2 * hf + 1]},
                                   {uq[2 * hf], uq[2 * hf + 1]});
        }
      } else {
#pragma unroll
        for (int nj = 0; nj < 4; ++nj) {
          const int col = n0 + wn * 32 + nj * 8 + 2 * c;
          if (col >= p.N) continue;
          const float v[2] = {acc[mi][nj][2 * hf], acc[mi][nj][2 * hf + 1]};
          store_out<false, 2, bf16>(p, row, col, v, v);
        }
      }
    }
  }
}

}  // namespace mma

// ---- wgmma path (sm_90a) -----------------------------------------------------------------------

namespace wg {

// The cp.async wgmma kernel (kWgmma128): 128 x 128 tiles, two blocks per SM, 3 stages (one k
// tile in flight per block). Its wgmma helpers (desc, fence_operands, wgmma_k16 for n = 256 and
// n = 128) are shared with the TMA kernel (namespace ws).
constexpr int BM = 128, BK = 64, kThreads = 256;
template <int BN_, int kStages_>
struct Cfg {
  static constexpr int BN = BN_, kStages = kStages_, kAhead = kStages - 2;
  static constexpr int kAStage = BM * BK * 2, kBStage = BN * BK * 2;     // bytes
  static constexpr size_t kSmem = kStages * (kAStage + kBStage) + 1024;  // + 1024-byte alignment
  static constexpr int kBlocksPerSm = BN == 128 ? 2 : 1;
  static_assert(kAhead >= 1, "a stage may still be read by the previous tile's wgmma");
};
using Narrow = Cfg<128, 3>;  // 97 KiB

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LOOM_MOE_WGMMA 1

using tma::fence_operands;
// Shared-memory matrix descriptor: K-major, 128-byte swizzle (kernels/cuda/tma_pipeline.cuh).
__device__ __forceinline__ uint64_t desc(uint32_t addr) { return tma::sw128_desc(addr); }

// d += A B^T for one warpgroup: A 64 x 16 and B 256 x 16 bf16 (K-major, 128-byte swizzle) in
// shared memory, described by da and db; d: the m64n256 f32 accumulator fragment.
__device__ __forceinline__ void wgmma_k16(float (&d)[128], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, "
      "%127"
      "}, %128, %129, p, 1, 1, 0, 0;\n"
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
        "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),
        "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]),
        "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
        "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]),
        "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]),
        "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]),
        "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]),
        "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]),
        "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(da), "l"(db), "r"(1));
}
// The same for B 128 x 16: d is the m64n128 f32 accumulator fragment.
__device__ __forceinline__ void wgmma_k16(float (&d)[64], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, 0, 0;\n"
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
      : "l"(da), "l"(db), "r"(1));
}
#endif

// Warpgroup w computes rows 64 w.. of the 128 x BN tile. Its accumulator d[4 j + q] is row
// 64 w + 16 (warp % 4) + g + 8 (q >> 1), column 8 j + 2c + (q & 1) (lane 4 g + c), as mma.sync's.
// Shared tiles: row r of a stage at r * 128 bytes, its 16-byte piece kc at (kc ^ (r % 8)) * 16:
// the 128-byte swizzle (stage bases 1024-byte aligned).
template <bool kDual, class C>
__global__ void __launch_bounds__(kThreads, C::kBlocksPerSm) kernel(GemmParams p) {
#if defined(LOOM_MOE_WGMMA)
  constexpr int BN = C::BN, kStages = C::kStages, kAhead = C::kAhead;
  constexpr int kAStage = C::kAStage, kBStage = C::kBStage, kBRows = BN / 32;
  extern __shared__ __align__(1024) unsigned char wg_smem[];
  const uint32_t raw = smem_addr(wg_smem);
  const uint32_t sA0 = (raw + 1023) & ~1023u, sB0 = sA0 + kStages * kAStage;
  const int slot = static_cast<int>(blockIdx.x / p.ntn), nt = static_cast<int>(blockIdx.x % p.ntn);
  const Tile t = find_tile(p.off, p.E, p.R, slot, BM);
  if (t.e < 0) return;
  const int n0 = nt * (kDual ? BN / 2 : BN);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, w = warp >> 2;
  const bf16* a = static_cast<const bf16*>(p.a);

  // Loads: piece kc = tid & 7 of rows (tid >> 3) + 32 i (A: i < 4, B: i < BN / 32); r % 8 is the
  // same for all of a thread's rows, so is the swizzled piece.
  const int kc = tid & 7, r0 = tid >> 3;
  const uint32_t dst0 = r0 * 128 + ((kc ^ (r0 & 7)) << 4);
  const bf16* a_src[4];
  const bf16* b_src[kBRows];
  uint32_t a_ok = 0, b_ok = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int row = t.row0 + r0 + 32 * i;
    const bool ok = row < t.row_end;
    a_ok |= ok ? 1u << i : 0u;
    a_src[i] = a + static_cast<int64_t>(ok ? row : 0) * p.K + kc * 8;
  }
#pragma unroll
  for (int i = 0; i < kBRows; ++i) {
    bool ok;
    b_src[i] = b_row<kDual>(p, t.e, n0, r0 + 32 * i, ok) + kc * 8;
    b_ok |= ok ? 1u << i : 0u;
  }
  const auto load = [&](int stage, int kt) {
    const int k = kt * BK;
    const bool k_ok = k + kc * 8 < p.K;
    const uint32_t da = sA0 + stage * kAStage + dst0, db = sB0 + stage * kBStage + dst0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const bool ok = k_ok && (a_ok >> i & 1u);
      cp_async16(da + i * 32 * 128, ok ? a_src[i] + k : a, ok);
    }
#pragma unroll
    for (int i = 0; i < kBRows; ++i) {
      const bool ok = k_ok && (b_ok >> i & 1u);
      cp_async16(db + i * 32 * 128, ok ? b_src[i] + k : a, ok);
    }
  };

  float d[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) d[i] = 0.0f;
  const int KT = (p.K + BK - 1) / BK;
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (s < KT) load(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<kAhead - 1>();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // our copies -> wgmma
    // Tile kt is in for everyone; every warpgroup has waited for its wgmma of tile kt - 2, whose
    // stage is refilled below.
    __syncthreads();
    if (kt + kAhead < KT) load((kt + kAhead) % kStages, kt + kAhead);
    cp_async_commit();
    const int stage = kt % kStages;
    const uint64_t da = desc(sA0 + stage * kAStage + w * 64 * 128);
    const uint64_t db = desc(sB0 + stage * kBStage);
    fence_operands(d);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int k16 = 0; k16 < BK / 16; ++k16) wgmma_k16(d, da + 2 * k16, db + 2 * k16);
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
    fence_operands(d);
  }
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  fence_operands(d);
  cp_async_wait<0>();

  const int g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int row = t.row0 + w * 64 + (warp & 3) * 16 + g + hf * 8;
    if (row >= t.row_end) continue;
    if constexpr (kDual) {
#pragma unroll
      for (int q = 0; q < BN / 16; ++q) {
        const int col = n0 + q * 8 + 2 * c;
        if (col >= p.N) continue;
        const float* dg = d + 4 * (2 * q) + 2 * hf;
        const float* du = d + 4 * (2 * q + 1) + 2 * hf;
        store_out<true, 2, bf16>(p, row, col, {dg[0], dg[1]}, {du[0], du[1]});
      }
    } else {
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        const int col = n0 + j * 8 + 2 * c;
        if (col >= p.N) continue;
        const float v[2] = {d[4 * j + 2 * hf], d[4 * j + 2 * hf + 1]};
        store_out<false, 2, bf16>(p, row, col, v, v);
      }
    }
  }
#else
  // Compiled for a device without wgmma: the host never launches this (moe_swiglu_supported).
  __trap();
#endif
}

}  // namespace wg

// ---- wgmma path, warp-specialised with TMA (sm_90a) --------------------------------------------

namespace ws {

// 128 x 256 tiles, k tiles of 64 in a 4-stage ring filled by TMA. Warpgroup 0 produces (one
// thread issues the copies), warpgroups 1 and 2 multiply rows 0-63 and 64-127 of the tile. A
// cluster of two CTAs takes two consecutive row tiles of one expert with the same B tile: CTA r
// copies B half r and multicasts it to both, halving B's L2 reads (without clusters the op ran
// 5% slower).
constexpr int BM = 128, BN = 256, BK = 64, kStages = 4, kThreads = 384, kCluster = 2;
constexpr int kAStage = BM * BK * 2, kBHalf = BN / 2 * BK * 2;  // bytes
constexpr int kStageBytes = kAStage + 2 * kBHalf;               // 48 KiB
// + 1024-byte alignment of the ring + a full and an empty barrier per stage.
constexpr size_t kSmem = kStages * kStageBytes + 1024 + 2 * kStages * 8;

using tma::cluster_rank;
using tma::cluster_sync;
using tma::mbar_arrive_cluster;
using tma::mbar_expect_tx;
using tma::mbar_init;
using tma::mbar_wait;
using tma::tma_load;
using tma::tma_load_multicast;

// Persistent: cluster c of C takes cluster tiles c, c + C, ... in the order (row-tile group,
// column tile), column tile fastest, so the clusters working at one time share A rows and a few
// experts' weights in L2. A cluster tile is two row tiles of one expert (find_tile with 2 BM
// rows). Gate/up (kDual): B rows 0-127 of a stage are W_gate's rows n0.., rows
// 128-255 W_up's, so accumulator column blocks j and j + 16 are g and u of the same columns of
// I in the same thread. Rows past the expert's end or past R, k past K and B rows past N load
// whatever TMA gives (zeros out of bounds, else other experts' rows): they only reach outputs
// that are never stored. A warpgroup whose 64 rows are all past the expert's end skips its
// wgmma (still releasing the stages).
template <bool kDual>
__global__ void __launch_bounds__(kThreads, 1)
    kernel(const __grid_constant__ CUtensorMap ta, const __grid_constant__ CUtensorMap tb0,
           const __grid_constant__ CUtensorMap tb1, GemmParams p) {
#if defined(LOOM_MOE_WGMMA)
  extern __shared__ __align__(1024) unsigned char ws_smem[];
  const uint32_t ring = (smem_addr(ws_smem) + 1023) & ~1023u;
  const uint32_t full0 = ring + kStages * kStageBytes, empty0 = full0 + kStages * 8;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const uint32_t rank = cluster_rank();
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full0 + 8 * s, 1);              // the producer's arrive (+ the bytes)
      mbar_init(empty0 + 8 * s, 8 * kCluster);  // every consumer warp of the cluster
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  cluster_sync();  // the peer's barriers are initialised before anything reaches them
  const int clusters = static_cast<int>(gridDim.x) / kCluster;
  const int first = static_cast<int>(blockIdx.x) / kCluster, rows = BM * kCluster;
  const int KT = (p.K + BK - 1) / BK;

  if (warp < 4) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (warp == 0) {
      int s = 0;
      uint32_t ph = 0;
      for (int ct = first;; ct += clusters) {
        const Tile t = find_tile(p.off, p.E, p.R, ct / p.ntn, rows);
        if (t.e < 0) break;
        const int nt = ct % p.ntn, arow = t.row0 + BM * static_cast<int>(rank);
        const int brow = t.e * p.N + nt * (kDual ? BN / 2 : BN);
        if (lane == 0) {
          for (int kt = 0; kt < KT; ++kt) {
            const uint32_t full = full0 + 8 * s, sa = ring + s * kStageBytes, sb = sa + kAStage;
            mbar_wait(empty0 + 8 * s, ph ^ 1);
            mbar_expect_tx(full, kStageBytes);
            tma_load(sa, &ta, kt * BK, arow, full);  // A: this CTA's rows
            // B half `rank` into both CTAs: W_gate / W_up's rows (gate/up), or W_down's rows
            // 128 rank.. of the tile (down).
            tma_load_multicast(sb + rank * kBHalf, kDual && rank ? &tb1 : &tb0, kt * BK,
                               brow + (kDual ? 0 : static_cast<int>(rank) * BN / 2), full,
                               (1u << kCluster) - 1);
            if (++s == kStages) {
              s = 0;
              ph ^= 1;
            }
          }
        }
        __syncwarp();
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const int w = (warp >> 2) - 1;  // rows 64 w.. of the CTA's tile
    int s = 0;
    uint32_t ph = 0;
    float d[128];
    const auto release = [&](int stage) {
      if (lane == 0) {
#pragma unroll
        for (int c = 0; c < kCluster; ++c) mbar_arrive_cluster(empty0 + 8 * stage, c);
      }
    };
    for (int ct = first;; ct += clusters) {
      const Tile t = find_tile(p.off, p.E, p.R, ct / p.ntn, rows);
      if (t.e < 0) break;
      const int nt = ct % p.ntn, r0 = t.row0 + BM * static_cast<int>(rank) + 64 * w;
      const bool busy = r0 < t.row_end;
#pragma unroll
      for (int i = 0; i < 128; ++i) d[i] = 0.0f;
      int prev = -1;
      const auto step = [&]() {
        if (prev >= 0) release(prev);  // the wgmma that read it is done
        prev = s;
        if (++s == kStages) {
          s = 0;
          ph ^= 1;
        }
      };
      if (busy) {
        for (int kt = 0; kt < KT; ++kt) {
          mbar_wait(full0 + 8 * s, ph);
          const uint32_t sa = ring + s * kStageBytes;
          const uint64_t da = wg::desc(sa + w * 64 * 128), db = wg::desc(sa + kAStage);
          wg::fence_operands(d);
          asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
          for (int k16 = 0; k16 < BK / 16; ++k16) wg::wgmma_k16(d, da + 2 * k16, db + 2 * k16);
          asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
          asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
          wg::fence_operands(d);
          step();
        }
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        wg::fence_operands(d);
      } else {
        for (int kt = 0; kt < KT; ++kt) {
          mbar_wait(full0 + 8 * s, ph);
          step();
        }
      }
      if (prev >= 0) release(prev);
      if (!busy) continue;

      const int g = lane >> 2, c = lane & 3, n0 = nt * (kDual ? BN / 2 : BN);
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int row = r0 + (warp & 3) * 16 + g + hf * 8;
        if (row >= t.row_end) continue;
        if constexpr (kDual) {
#pragma unroll
          for (int j = 0; j < BN / 16; ++j) {
            const int col = n0 + j * 8 + 2 * c;
            if (col >= p.N) continue;
            const float* dg = d + 4 * j + 2 * hf;
            const float* du = d + 4 * (j + BN / 16) + 2 * hf;
            store_out<true, 2, bf16>(p, row, col, {dg[0], dg[1]}, {du[0], du[1]});
          }
        } else {
#pragma unroll
          for (int j = 0; j < BN / 8; ++j) {
            const int col = n0 + j * 8 + 2 * c;
            if (col >= p.N) continue;
            const float v[2] = {d[4 * j + 2 * hf], d[4 * j + 2 * hf + 1]};
            store_out<false, 2, bf16>(p, row, col, v, v);
          }
        }
      }
    }
  }
  // No CTA may leave while its peer can still arrive on its barriers or copy into it.
  cluster_sync();
#else
  __trap();  // compiled for a device without wgmma: never launched (moe_swiglu_plan)
#endif
}

}  // namespace ws

// ---- kGemv: decode shapes (namespace gv)
// --------------------------------------------------------- A few rows per expert (a decode step: T
// tokens x top-K slots, at most T rows per expert): the tiled paths' tiles follow the experts'
// rows, so there they leave most SMs idle. At one token of the 48B-shaped model (top-8 of 256
// experts, D 2304, I 1024) the TMA kernel has 32 gate/up tiles of 128 x 256 and 72 down tiles for
// 132 SMs: 41 and 25 us a layer under ncu, 1.8 and 1.5 TB/s on the expert weights
// (bench/results/gpu-h200.md). Here a warp per weight row (a column of I for gate/up, W_gate's and
// W_up's rows read side by side; a column of D for down) takes an expert's rows BM at a time (row
// tiles of find_tile, over the offsets staged in shared memory once per block), so the grid spreads
// over the experts' weight rows, each weight byte is read once per row tile, and 16-byte streaming
// loads, four per lane in flight, keep the bytes moving. Arithmetic in f32 (bf16 weights and x
// widened), h kept f32: the SIMT path's numbers but for the summation order. Each output element is
// one warp's dot product in a fixed order (lane-strided k, then warp_sum) of its row of x (or h)
// and the expert's weights only: the same bits alone and in any batch on this path; kAuto takes it
// by the row count, so batch-invariant mode never does.
namespace gv {
constexpr int kWarps = 8;          // weight rows per block
constexpr int BM = 2;              // an expert's rows per tile (decode: mostly 1)
constexpr int kMaxExperts = 4096;  // offsets staged in shared memory (16 KiB)

// kUnroll: k steps (8 elements a lane each) whose loads are in flight at once. A block takes the
// column blocks blockIdx.x, blockIdx.x + gridDim.x, ... of its row tile, so that a grid capped at
// about one wave of blocks pays the offsets' staging and find_tile once per block rather than
// once per 8 columns (the down GEMM's 288 column blocks x 8 row tiles were ~2.2 waves at one
// token).
//
// The tile search is most of a block's time before its first weight load at one token (the bytes
// it then reads take a few microseconds): with at most a block's threads of experts, thread e
// counts expert e's tiles and one block scan finds the slot's (find_tile_block) instead of
// staging the offsets and scanning them 32 experts at a time in every warp (find_tile); the
// gate/up launch hands its tiles to the down launch (GemmParams::tiles_out / tiles_in), which
// reads one int4. Expert-GEMV micro-benchmark, 26 layers at one token, a graph with programmatic
// edges: 40.2 us a layer (staged search in both launches), 37.8 (block search in both), 34.8 (a
// tile list read by both); bench/results/gpu-h200.md.
__device__ __forceinline__ Tile gv_tile(const GemmParams& p) {
  const int slot = static_cast<int>(blockIdx.y);
  Tile t;
  if (p.tiles_in != nullptr) {
    const int4 q = p.tiles_in[slot];
    t.e = q.x, t.row0 = q.y, t.row_end = q.z;
    return t;
  }
  if (p.E <= kWarps * 32) {
    t = find_tile_block<kWarps * 32>(p.off, p.E, p.R, slot, BM);
  } else {
    __shared__ int32_t off[kMaxExperts + 1];
    for (int e = threadIdx.x; e <= p.E; e += blockDim.x) off[e] = p.off[e];
    __syncthreads();
    t = find_tile(off, p.E, p.R, slot, BM);
  }
  if (p.tiles_out != nullptr && blockIdx.x == 0 && threadIdx.x == 0)
    p.tiles_out[slot] = make_int4(t.e, t.row0, t.row_end, 0);
  return t;
}

template <bool kDual, typename AT, int kUnroll>
__global__ void __launch_bounds__(kWarps * 32) kernel(GemmParams p, int col_blocks) {
  dev::pdl_wait();  // PDL-aware (kernels/cuda/pdl.h): before any access
  const Tile t = gv_tile(p);
  if (t.e < 0) return;  // uniform across the block
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rows = min(BM, t.row_end - t.row0);
  const AT* a = static_cast<const AT*>(p.a) + static_cast<int64_t>(t.row0) * p.K;
  for (int cb = static_cast<int>(blockIdx.x); cb < col_blocks; cb += static_cast<int>(gridDim.x)) {
    const int col = cb * kWarps + warp;
    if (col >= p.N) break;  // uniform across the warp; later column blocks lie further out
    const int64_t wofs = (static_cast<int64_t>(t.e) * p.N + col) * p.K;
    const bf16* w0 = static_cast<const bf16*>(p.b0) + wofs;
    const bf16* w1 = kDual ? static_cast<const bf16*>(p.b1) + wofs : nullptr;
    float g[BM], u[BM];
#pragma unroll
    for (int r = 0; r < BM; ++r) g[r] = u[r] = 0.0f;
#pragma unroll kUnroll
    for (int k = lane * 8; k < p.K; k += 32 * 8) {
      float wg[8], wu[8];
      {
        const uint4 q = __ldcs(reinterpret_cast<const uint4*>(w0 + k));
        dev::ld_vec(reinterpret_cast<const bf16*>(&q), wg);
      }
      if constexpr (kDual) {
        const uint4 q = __ldcs(reinterpret_cast<const uint4*>(w1 + k));
        dev::ld_vec(reinterpret_cast<const bf16*>(&q), wu);
      }
#pragma unroll
      for (int r = 0; r < BM; ++r) {
        if (r < rows) {
          float xf[8];
          dev::ld_vec(a + static_cast<int64_t>(r) * p.K + k, xf);
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            g[r] = fmaf(wg[e], xf[e], g[r]);
            if constexpr (kDual) u[r] = fmaf(wu[e], xf[e], u[r]);
          }
        }
      }
    }
    float mine_g[1] = {0.0f}, mine_u[1] = {0.0f};  // lane r keeps row r's sums
#pragma unroll
    for (int r = 0; r < BM; ++r) {
      const float sg = dev::warp_sum(g[r]);
      const float su = kDual ? dev::warp_sum(u[r]) : 0.0f;
      if (lane == r) mine_g[0] = sg, mine_u[0] = su;
    }
    if (lane < rows) store_out<kDual, 1, float>(p, t.row0 + lane, col, mine_g, mine_u);
  }
}

int sm_count() {
  static const int n = [] {
    int dev = 0, sms = 0;
    LOOM_CUDA_CHECK(cudaGetDevice(&dev));
    LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return sms;
  }();
  return n;
}

// The grid: every row tile (y) times the column blocks (x). Where the tile search is the staged
// one (more experts than a block has threads), at most one wave of resident blocks' worth of
// column blocks, each block looping over its share so that it pays the search once for several:
// at one token that was 1.13x faster than a block per column block (2296 -> 2596 GB/s of expert
// weights; moe_cuda_bench decode, s19c). With the block search or a handed-over tile a block per
// column block is faster again (36.1 against 37.8 us a layer with the block search, 33.9 against
// 34.8 with tiles; the micro-benchmark above).
template <bool kDual, typename AT>
void launch_kernel(cudaStream_t stream, const GemmParams& p, int64_t slots) {
  const int64_t cols = (p.N + kWarps - 1) / kWarps;
  if (cols == 0) return;
  LOOM_CHECK_GRID(cols);
  static const int per_sm = [] {
    int b = 0;
    LOOM_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel<kDual, AT, 4>, kWarps * 32, 0));
    return std::max(b, 1);
  }();
  const bool cheap_search = p.tiles_in != nullptr || p.E <= kWarps * 32;
  const int64_t grid_x =
      cheap_search ? cols
                   : std::clamp<int64_t>(int64_t{sm_count()} * per_sm / std::max<int64_t>(slots, 1),
                                         1, cols);
  LOOM_MARK_PDL_KERNEL((kernel<kDual, AT, 4>));
  kernel<kDual, AT, 4><<<dim3(static_cast<unsigned>(grid_x), static_cast<unsigned>(slots)),
                         kWarps * 32, 0, stream>>>(p, static_cast<int>(cols));
  LOOM_CUDA_CHECK_LAUNCH();
}

// The scratch after h: the tile list the gate/up launch hands the down launch.
size_t tiles_bytes(int64_t R, int64_t E) {
  return sizeof(int4) * static_cast<size_t>(std::min<int64_t>(R, row_slots(R, E, BM)));
}

void run(cudaStream_t stream, const launch::MoeSwigluArgs& a, GemmParams up, GemmParams down,
         int4* tiles) {
  // Row tiles that can hold rows: at most R (each has one), at most ceil(R / BM) + E.
  const int64_t slots = std::min<int64_t>(a.R, row_slots(a.R, a.E, BM));
  LOOM_CHECK_GRID(slots);
  // Both launches run (the gate/up one has columns: I > 0): the second reads the first's tiles.
  if ((a.phases & 6) == 6 && a.I > 0) {
    up.tiles_out = tiles;
    down.tiles_in = tiles;
  }
  if (a.phases & 2) {
    if (a.x_bf16) {
      launch_kernel<true, bf16>(stream, up, slots);
    } else {
      launch_kernel<true, float>(stream, up, slots);
    }
  }
  if (a.phases & 4) launch_kernel<false, float>(stream, down, slots);
}

}  // namespace gv

// ---- host side ---------------------------------------------------------------------------------

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
size_t align256(size_t n) { return (n + 255) / 256 * 256; }

bool tensor_core_shape(const launch::MoeSwigluArgs& a) {
  return a.bf16 && a.D % 8 == 0 && a.I % 8 == 0 && aligned16(a.x) && aligned16(a.y) &&
         aligned16(a.w_gate) && aligned16(a.w_up) && aligned16(a.w_down) &&
         (a.gate_up == nullptr || aligned16(a.gate_up));
}

using tma::allow_smem;
using tma::device_has_wgmma;

// One GEMM of the SIMT, mma.sync or cp.async wgmma path: a block per (row-tile slot, column tile
// of bn columns).
template <typename Kernel>
void launch_tiles(cudaStream_t stream, Kernel kernel, GemmParams p, int64_t slots, int bn,
                  int threads, size_t smem) {
  p.ntn = (p.N + bn - 1) / bn;
  if (p.ntn == 0) return;
  const int64_t blocks = slots * p.ntn;
  LOOM_CHECK_GRID(blocks);
  kernel<<<static_cast<unsigned>(blocks), threads, smem, stream>>>(p);
  LOOM_CUDA_CHECK_LAUNCH();
}

// Both GEMMs of a cp.async path (mma.sync or wgmma): bm x bn block tiles, the gate/up GEMM's
// holding bn / 2 columns of I (g and u side by side).
template <auto kUp, auto kDown>
void run_tiles(cudaStream_t stream, const launch::MoeSwigluArgs& a, const GemmParams& up,
               const GemmParams& down, int bm, int bn, int threads, size_t smem) {
  static std::atomic<uint64_t> up_done{0}, down_done{0};
  allow_smem(kUp, smem, up_done);
  allow_smem(kDown, smem, down_done);
  const int64_t slots = row_slots(a.R, a.E, bm);
  if (a.phases & 2) launch_tiles(stream, kUp, up, slots, bn / 2, threads, smem);
  if (a.phases & 4) launch_tiles(stream, kDown, down, slots, bn, threads, smem);
}

// ---- TMA launches (kWgmma) ---------------------------------------------------------------------

using tma::resident_clusters;
using tma::tensor_map_encoder;

// A row-major bf16 matrix [rows, k] read in boxes of 64 k x 128 rows, 128-byte swizzled (the
// layout wg::desc describes). k % 8 == 0 (rows of whole 16-byte pieces); k == 0 is never read.
CUtensorMap tensor_map(const void* base, int64_t rows, int64_t k) {
  CUtensorMap m;
  const cuuint64_t kk = static_cast<cuuint64_t>(std::max<int64_t>(k, 8));
  const cuuint64_t dims[2] = {kk, static_cast<cuuint64_t>(std::max<int64_t>(rows, 1))};
  const cuuint64_t strides[1] = {kk * 2};
  const cuuint32_t box[2] = {ws::BK, ws::BM};
  const cuuint32_t unit[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(
      &m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides, box, unit,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) tma::fail("cuTensorMapEncodeTiled", static_cast<int>(r));
  return m;
}

// One GEMM of the kWgmma path: a persistent grid of as many clusters as fit, or fewer when there
// are fewer cluster tiles (sum_e ceil(n_e / (2 BM)) <= ceil(R / (2 BM)) + E).
template <bool kDual>
void launch_ws(cudaStream_t stream, GemmParams p, const CUtensorMap& ta, const CUtensorMap& tb0,
               const CUtensorMap& tb1) {
  constexpr int kCluster = ws::kCluster;
  const auto kernel = ws::kernel<kDual>;
  static std::atomic<uint64_t> smem_done{0};
  static std::atomic<int> clusters_cache[64];
  allow_smem(kernel, ws::kSmem, smem_done);
  p.ntn = (p.N + (kDual ? ws::BN / 2 : ws::BN) - 1) / (kDual ? ws::BN / 2 : ws::BN);
  if (p.ntn == 0) return;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kCluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(kCluster);
  cfg.blockDim = dim3(ws::kThreads);
  cfg.dynamicSmemBytes = ws::kSmem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  const int64_t rows = int64_t{ws::BM} * kCluster;
  const int64_t tiles = ((p.R + rows - 1) / rows + p.E) * p.ntn;
  const int64_t clusters = std::min(tiles, resident_clusters(kernel, cfg, clusters_cache));
  cfg.gridDim = dim3(static_cast<unsigned>(clusters * kCluster));
  LOOM_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, ta, tb0, tb1, p));
}

void run_ws(cudaStream_t stream, const launch::MoeSwigluArgs& a, const GemmParams& up,
            const GemmParams& down) {
  if (a.phases & 2) {
    launch_ws<true>(stream, up, tensor_map(up.a, a.R, a.D), tensor_map(a.w_gate, a.E * a.I, a.D),
                    tensor_map(a.w_up, a.E * a.I, a.D));
  }
  if (a.phases & 4) {
    const CUtensorMap wd = tensor_map(a.w_down, a.E * a.D, a.I);
    launch_ws<false>(stream, down, tensor_map(down.a, a.R, a.I), wd, wd);
  }
}

}  // namespace

namespace launch {

const char* moe_gemm_path_name(MoeGemmPath path) {
  switch (path) {
    case MoeGemmPath::kAuto:
      return "auto";
    case MoeGemmPath::kSimt:
      return "simt";
    case MoeGemmPath::kMma:
      return "mma";
    case MoeGemmPath::kWgmma:
      return "wgmma";
    case MoeGemmPath::kWgmma128:
      return "wgmma128";
    case MoeGemmPath::kGemv:
      return "gemv";
    case MoeGemmPath::kWgmmaFp8:
      return "wgmma_fp8";
  }
  return "?";
}

MoeSwigluPlan moe_swiglu_plan(const MoeSwigluArgs& a, MoeGemmPath path) {
  if (a.fp8) return moe_fp8_swiglu_plan(a, path);
  const bool tc = tensor_core_shape(a);
  const bool wgmma = tc && device_has_wgmma();
  const bool gemv = tc && a.E <= gv::kMaxExperts && a.R < 65536;
  if (path == MoeGemmPath::kAuto) {
    path = !tc                                                             ? MoeGemmPath::kSimt
           : gemv && !a.batch_invariant && a.R <= launch::kMoeGemvAutoRows ? MoeGemmPath::kGemv
           : wgmma                                                         ? MoeGemmPath::kWgmma
                                                                           : MoeGemmPath::kMma;
  }
  MoeSwigluPlan plan;
  plan.path = path;
  plan.ok = path == MoeGemmPath::kSimt || (path == MoeGemmPath::kMma && tc) ||
            (path == MoeGemmPath::kGemv && gemv) ||
            ((path == MoeGemmPath::kWgmma || path == MoeGemmPath::kWgmma128) && wgmma);
  // h (f32 on the SIMT and GEMV paths; the GEMV path's tile list after it), then (tensor cores,
  // f32 x) x's bf16 copy.
  const size_t rows = static_cast<size_t>(a.R);
  plan.scratch_bytes = path == MoeGemmPath::kSimt ? align256(rows * a.I * sizeof(float))
                       : path == MoeGemmPath::kGemv
                           ? align256(rows * a.I * sizeof(float)) + gv::tiles_bytes(a.R, a.E)
                           : align256(rows * a.I * sizeof(bf16)) +
                                 (a.x_bf16 ? 0 : align256(rows * a.D * sizeof(bf16)));
  return plan;
}

void moe_grouped_swiglu(cudaStream_t stream, const MoeSwigluArgs& a, const MoeSwigluPlan& plan,
                        void* scratch) {
  if (a.fp8) return moe_fp8_grouped_swiglu(stream, a, plan, scratch);
  if (a.R == 0 || a.E == 0) return;
  GemmParams up;  // gate/up GEMM
  up.off = a.offsets;
  up.E = static_cast<int>(a.E);
  up.R = static_cast<int>(a.R);
  up.N = static_cast<int>(a.I);
  up.K = static_cast<int>(a.D);
  up.b0 = a.w_gate;
  up.b1 = a.w_up;
  up.gate_up = a.gate_up;
  GemmParams down;  // down GEMM
  down.off = a.offsets;
  down.E = up.E;
  down.R = up.R;
  down.N = static_cast<int>(a.D);
  down.K = static_cast<int>(a.I);
  down.b0 = a.w_down;
  down.y = a.y;
  down.y_bf16 = a.y_bf16;

  if (plan.path == MoeGemmPath::kGemv) {
    up.a = a.x;
    up.h = scratch;
    down.a = scratch;
    const size_t h_bytes = align256(static_cast<size_t>(a.R) * a.I * sizeof(float));
    gv::run(stream, a, up, down, reinterpret_cast<int4*>(static_cast<char*>(scratch) + h_bytes));
    return;
  }
  if (plan.path == MoeGemmPath::kSimt) {
    up.a = a.x;
    up.h = scratch;
    down.a = scratch;
    const int64_t slots = row_slots(a.R, a.E, simt::BM);
    if (a.phases & 2) {
      const auto kernel =
          a.bf16 ? (a.x_bf16 ? simt::kernel<true, true, true> : simt::kernel<true, true, false>)
                 : (a.x_bf16 ? simt::kernel<true, false, true> : simt::kernel<true, false, false>);
      launch_tiles(stream, kernel, up, slots, simt::BN, simt::kThreads, 0);
    }
    if (a.phases & 4) {
      launch_tiles(stream,
                   a.bf16 ? simt::kernel<false, true, false> : simt::kernel<false, false, false>,
                   down, slots, simt::BN, simt::kThreads, 0);
    }
    return;
  }

  // The scratch: h, then the bf16 copy of an f32 x (a bf16 x is the GEMM's operand itself).
  char* base = static_cast<char*>(scratch);
  bf16* h = reinterpret_cast<bf16*>(base);
  up.a = a.x;
  if (!a.x_bf16) {
    bf16* xb = reinterpret_cast<bf16*>(base + align256(static_cast<size_t>(a.R) * a.I * 2));
    if (a.D > 0 && (a.phases & 1)) {
      const int64_t quads = a.R * a.D / 4;
      const int64_t blocks = std::min<int64_t>(
          (quads + 256 * kCastUnroll - 1) / (256 * kCastUnroll), int64_t{132} * 64);
      x_to_bf16_kernel<<<static_cast<unsigned>(std::max<int64_t>(blocks, 1)), 256, 0, stream>>>(
          static_cast<const float*>(a.x), a.offsets, up.E, up.R, a.D, xb);
      LOOM_CUDA_CHECK_LAUNCH();
    }
    up.a = xb;
  }
  up.h = h;
  down.a = h;
  if (plan.path == MoeGemmPath::kWgmma) {
    run_ws(stream, a, up, down);
  } else if (plan.path == MoeGemmPath::kMma) {
    run_tiles<mma::kernel<true>, mma::kernel<false>>(stream, a, up, down, mma::BM, mma::BN,
                                                     mma::kThreads, mma::kSmem);
  } else {
    run_tiles<wg::kernel<true, wg::Narrow>, wg::kernel<false, wg::Narrow>>(
        stream, a, up, down, wg::BM, wg::Narrow::BN, wg::kThreads, wg::Narrow::kSmem);
  }
}

}  // namespace launch
}  // namespace loom::cuda
