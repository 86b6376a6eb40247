// The grouped SwiGLU of kernels/moe.h with stored FP8 expert weights (core/fp8_matrix.h: e4m3
// values, one f32 scale_inv per 128 x 128 block of each expert's matrix). Every weight is used
// as the reference dequantization defines it, w = f32(q) * scale_inv (one f32 product), and
// every sum is f32; the paths differ in where that product lives:
//   kGemv (namespace gv8, decode): the gv path of kernels/cuda/moe_gemm.cu on e4m3 bytes: a warp
//     per weight row, an expert's rows two at a time (find_tile over the offsets staged in shared
//     memory), each lane streaming 16 weights (16 bytes, half of bf16's bytes per weight) per load
//     and dequantizing them in registers with the scale of their 128-column block; x (or h) read
//     as it is, f32 FMA, a warp reduction. h = silu(g) * u stays f32. Rows whose K is not a
//     multiple of 16 (or unaligned tensors) take one weight per lane per step instead. kAuto
//     takes it outside batch-invariant mode up to kMoeFp8GemvRowsPerExpert rows per expert on
//     average (kMoeGemvAutoRows rows in all where that is more; kernels/cuda/moe_fp8_launch.h).
//   every other path (prefill, and batch-invariant mode at any size): the experts are
//     dequantized a chunk at a time into the scratch (at most kMoeFp8DequantBytes; experts the
//     call routes no row to are skipped, as the offsets say on the device), then the chunk runs
//     through the bf16 grouped kernels (kWgmma / kMma / kWgmma128: the product rounded once to
//     bf16, as a bf16 checkpoint's weight is) or, on kSimt, the f32 ones (the product kept: the
//     CPU twin's numbers but for the summation order). A chunk's call gets the offsets from its
//     first expert on: its rows are rows of the whole x and y, so h, x and y need no reindexing.
//   kWgmmaFp8 (sm_90a, kernels/cuda/moe_fp8_wgmma.cu): DeepSeek-V3's W8A8 recipe. x is quantized
//     per row and 128 columns (launch::quantize_fp8_groups, e4m3 + f32 scales, into the scratch),
//     the gate/up GEMM runs block-scaled FP8 wgmma on it and the stored weights as they are and
//     quantizes h = silu(g) * u the same way in its epilogue, the down GEMM runs on that. No
//     weight copies; the activations' quantization (relative error <= 2^-4 per element) is the
//     price. kAuto takes it outside batch-invariant mode from kMoeFp8BlockRowsPerExpert rows per
//     expert on average (kernels/cuda/moe_fp8_launch.h).
// The chunking costs a pass over the routed experts' bytes (read 1, write 2 or 4, then read
// again by the GEMM): it pays where the GEMMs are compute-bound (hundreds of rows per expert).
// Batch invariance: each output is one dot product in a fixed order of its row and the expert's
// weights on every path (on kWgmmaFp8, of its row's quantized values, whose scales depend on the
// row only), and kAuto picks by the row count only outside batch-invariant mode, where it takes
// the copies at every row count past the GEMV's.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/bf16_io.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fp8_convert.cuh"
#include "kernels/cuda/gemm_fp8_launch.h"
#include "kernels/cuda/moe_fp8_launch.h"
#include "kernels/cuda/moe_gemm_common.cuh"

namespace loom::cuda {
namespace {

using moe_gemm::bf16;
using moe_gemm::find_tile;
using moe_gemm::GemmParams;
using moe_gemm::row_slots;
using moe_gemm::store_out;
using moe_gemm::Tile;

constexpr int kBlock = 128;  // rows and columns per weight scale

// Sixteen e4m3 weights (one 16-byte load) dequantized with their block's scale: f32(q) * s.
__device__ __forceinline__ void dequant16(const uint4& q, float s, float (&w)[16]) {
  const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 lo = dev::e4m3x2_to_f32(words[j]), hi = dev::e4m3x2_to_f32(words[j] >> 16);
    w[4 * j] = __fmul_rn(lo.x, s);
    w[4 * j + 1] = __fmul_rn(lo.y, s);
    w[4 * j + 2] = __fmul_rn(hi.x, s);
    w[4 * j + 3] = __fmul_rn(hi.y, s);
  }
}

// ---- kGemv (namespace gv8) ---------------------------------------------------------------------
namespace gv8 {
constexpr int kWarps = 8;          // weight rows per block
constexpr int BM = 2;              // an expert's rows per tile
constexpr int kMaxExperts = 4096;  // offsets staged in shared memory (16 KiB)

// p.b0 (and p.b1 on gate/up) e4m3 [E, N, K], s0 (s1) their grids [E, ceil(N / 128), ceil(K /
// 128)]. kVec: K % 16 == 0 and 16-byte aligned weights and A rows.
template <bool kDual, typename AT, bool kVec>
__global__ void __launch_bounds__(kWarps * 32)
    kernel(GemmParams p, const float* __restrict__ s0, const float* __restrict__ s1) {
  __shared__ int32_t off[kMaxExperts + 1];
  for (int e = threadIdx.x; e <= p.E; e += blockDim.x) off[e] = p.off[e];
  __syncthreads();
  const Tile t = find_tile(off, p.E, p.R, static_cast<int>(blockIdx.y), BM);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int col = static_cast<int>(blockIdx.x) * kWarps + warp;
  if (t.e < 0 || col >= p.N) return;  // uniform across the warp
  const int rows = min(BM, t.row_end - t.row0);
  const int64_t gn = (p.N + kBlock - 1) / kBlock, gk = (p.K + kBlock - 1) / kBlock;
  const int64_t wofs = (static_cast<int64_t>(t.e) * p.N + col) * p.K;
  const int64_t sofs = (static_cast<int64_t>(t.e) * gn + col / kBlock) * gk;
  const uint8_t* w0 = static_cast<const uint8_t*>(p.b0) + wofs;
  const uint8_t* w1 = kDual ? static_cast<const uint8_t*>(p.b1) + wofs : nullptr;
  const float* r0 = s0 + sofs;  // this weight row's scales, one per 128 columns
  const float* r1 = kDual ? s1 + sofs : nullptr;
  const AT* a = static_cast<const AT*>(p.a) + static_cast<int64_t>(t.row0) * p.K;
  float g[BM], u[BM];
#pragma unroll
  for (int r = 0; r < BM; ++r) g[r] = u[r] = 0.0f;
  if constexpr (kVec) {
#pragma unroll 2
    for (int k = lane * 16; k < p.K; k += 32 * 16) {
      float wg[16], wu[16];
      dequant16(__ldcs(reinterpret_cast<const uint4*>(w0 + k)), __ldg(r0 + k / kBlock), wg);
      if constexpr (kDual)
        dequant16(__ldcs(reinterpret_cast<const uint4*>(w1 + k)), __ldg(r1 + k / kBlock), wu);
#pragma unroll
      for (int r = 0; r < BM; ++r) {
        if (r < rows) {
          float xf[16];
          dev::ld_vec(a + static_cast<int64_t>(r) * p.K + k, xf);
#pragma unroll
          for (int e = 0; e < 16; ++e) {
            g[r] = fmaf(wg[e], xf[e], g[r]);
            if constexpr (kDual) u[r] = fmaf(wu[e], xf[e], u[r]);
          }
        }
      }
    }
  } else {
    for (int k = lane; k < p.K; k += 32) {
      const float wg = __fmul_rn(dev::e4m3_to_f32(w0[k]), __ldg(r0 + k / kBlock));
      const float wu = kDual ? __fmul_rn(dev::e4m3_to_f32(w1[k]), __ldg(r1 + k / kBlock)) : 0.0f;
#pragma unroll
      for (int r = 0; r < BM; ++r) {
        if (r < rows) {
          const float xv = dev::ld(a + static_cast<int64_t>(r) * p.K + k);
          g[r] = fmaf(wg, xv, g[r]);
          if constexpr (kDual) u[r] = fmaf(wu, xv, u[r]);
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

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

void run(cudaStream_t stream, const launch::MoeSwigluArgs& a, const GemmParams& up,
         const GemmParams& down) {
  const int64_t slots = std::min<int64_t>(a.R, row_slots(a.R, a.E, BM));
  const auto launch = [&](auto kernel, const GemmParams& p, const float* s0, const float* s1) {
    const int64_t cols = (p.N + kWarps - 1) / kWarps;
    if (cols == 0 || slots == 0) return;
    LOOM_CHECK_GRID(cols);
    kernel<<<dim3(static_cast<unsigned>(cols), static_cast<unsigned>(slots)), kWarps * 32, 0,
             stream>>>(p, s0, s1);
    LOOM_CUDA_CHECK_LAUNCH();
  };
  if (a.phases & 2) {
    const bool vec = a.D % 16 == 0 && aligned16(a.x) && aligned16(a.w_gate) && aligned16(a.w_up);
    if (a.x_bf16) {
      launch(vec ? kernel<true, bf16, true> : kernel<true, bf16, false>, up, a.s_gate, a.s_up);
    } else {
      launch(vec ? kernel<true, float, true> : kernel<true, float, false>, up, a.s_gate, a.s_up);
    }
  }
  if (a.phases & 4) {
    const bool vec = a.I % 16 == 0 && aligned16(down.a) && aligned16(a.w_down);
    launch(vec ? kernel<false, float, true> : kernel<false, float, false>, down, a.s_down, nullptr);
  }
}

}  // namespace gv8

// ---- dequantization of a chunk of experts ------------------------------------------------------

constexpr int kDequantThreads = 256;

__device__ __forceinline__ void put16(float* o, const float (&w)[16]) {
#pragma unroll
  for (int j = 0; j < 16; j += 4)
    *reinterpret_cast<float4*>(o + j) = make_float4(w[j], w[j + 1], w[j + 2], w[j + 3]);
}
__device__ __forceinline__ void put16(bf16* o, const float (&w)[16]) {
  uint32_t packed[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) packed[j] = moe_gemm::pack_bf16(w[2 * j], w[2 * j + 1]);
  uint4* o4 = reinterpret_cast<uint4*>(o);
  o4[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  o4[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
}

// out[c] (expert e0 + c of w, [n, k] each) = f32(q) * scale_inv, stored f32 or rounded to bf16;
// blockIdx.y = c. An expert the offsets give no row is skipped (no path reads its copy).
// kVec: k % 16 == 0, w and out 16-byte aligned.
template <typename OT, bool kVec>
__global__ void __launch_bounds__(kDequantThreads)
    dequant_experts_kernel(const uint8_t* __restrict__ w, const float* __restrict__ scale_inv,
                           const int32_t* __restrict__ off, int e0, int R, int64_t n, int64_t k,
                           OT* __restrict__ out) {
  const int e = e0 + static_cast<int>(blockIdx.y);
  const int lo = min(max(off[e], 0), R);
  if (min(max(off[e + 1], lo), R) <= lo) return;
  const int64_t gn = (n + kBlock - 1) / kBlock, gk = (k + kBlock - 1) / kBlock;
  w += static_cast<int64_t>(e) * n * k;
  scale_inv += static_cast<int64_t>(e) * gn * gk;
  out += static_cast<int64_t>(blockIdx.y) * n * k;
  const int64_t per = kVec ? 16 : 1;
  const int64_t units = n * k / per;
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * kDequantThreads + threadIdx.x; u < units;
       u += static_cast<int64_t>(gridDim.x) * kDequantThreads) {
    const int64_t i = u * per, row = i / k, col = i % k;
    const float s = __ldg(scale_inv + (row / kBlock) * gk + col / kBlock);
    if constexpr (kVec) {
      float v[16];
      dequant16(__ldcs(reinterpret_cast<const uint4*>(w + i)), s, v);
      put16(out + i, v);
    } else {
      dev::st(out + i, __fmul_rn(dev::e4m3_to_f32(w[i]), s));
    }
  }
}

template <typename OT>
void dequant_experts(cudaStream_t stream, const void* w, const float* scale_inv, const int32_t* off,
                     int64_t e0, int64_t count, int64_t R, int64_t n, int64_t k, OT* out) {
  if (count == 0 || n * k == 0) return;
  const bool vec = k % 16 == 0 && gv8::aligned16(w) && gv8::aligned16(out);
  // About 8 blocks per SM over the chunk, each striding over its expert's matrix.
  const int64_t per_expert = std::max<int64_t>(
      1, std::min<int64_t>((132 * 8 + count - 1) / count, (n * k / (vec ? 16 : 1) + 255) / 256));
  const dim3 grid(static_cast<unsigned>(per_expert), static_cast<unsigned>(count));
  const auto* wq = static_cast<const uint8_t*>(w);
  if (vec) {
    dequant_experts_kernel<OT, true><<<grid, kDequantThreads, 0, stream>>>(
        wq, scale_inv, off, static_cast<int>(e0), static_cast<int>(R), n, k, out);
  } else {
    dequant_experts_kernel<OT, false><<<grid, kDequantThreads, 0, stream>>>(
        wq, scale_inv, off, static_cast<int>(e0), static_cast<int>(R), n, k, out);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

// ---- host side ---------------------------------------------------------------------------------

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// The args a chunk's call runs with: the FP8 args with a dequantized copy (bf16, or f32 on the
// SIMT path) as the weights. For planning, the copies' addresses are stand-ins with the
// alignment the scratch gives them (256 bytes): the plan reads no memory.
launch::MoeSwigluArgs chunk_args(const launch::MoeSwigluArgs& a, bool bf16_copy) {
  launch::MoeSwigluArgs b = a;
  b.fp8 = false;
  b.bf16 = bf16_copy;
  b.s_gate = b.s_up = b.s_down = nullptr;
  const void* stand_in = reinterpret_cast<const void*>(uintptr_t{256});
  b.w_gate = b.w_up = b.w_down = stand_in;
  return b;
}

// Experts per chunk: as many as kMoeFp8DequantBytes (or the args' own budget) holds, at least one,
// at most E (and the dequantization's grid height).
int64_t chunk_experts(const launch::MoeSwigluArgs& a, size_t elem) {
  const size_t per = 3 * static_cast<size_t>(a.I) * static_cast<size_t>(a.D) * elem;
  const size_t budget = a.fp8_chunk_bytes > 0 ? a.fp8_chunk_bytes : launch::kMoeFp8DequantBytes;
  const int64_t fit = per == 0 ? a.E : static_cast<int64_t>(budget / per);
  return std::clamp<int64_t>(std::min<int64_t>(fit, 65535), 1, std::max<int64_t>(a.E, 1));
}

// ---- kWgmmaFp8
// -----------------------------------------------------------------------------------

int64_t scale_blocks(int64_t n) { return (n + kBlock - 1) / kBlock; }

// The block-scaled path's scratch: x quantized [R, D] e4m3 and its scales [ceil(D / 128), R],
// then h quantized [R, I] and its scales [ceil(I / 128), R].
struct BlockScratch {
  size_t xq, xs, hq, hs, total;
};
BlockScratch block_scratch(const launch::MoeSwigluArgs& a) {
  const size_t R = static_cast<size_t>(a.R);
  BlockScratch b{};
  b.xq = 0;
  b.xs = b.xq + align256(R * a.D);
  b.hq = b.xs + align256(R * scale_blocks(a.D) * sizeof(float));
  b.hs = b.hq + align256(R * a.I);
  b.total = b.hs + align256(R * scale_blocks(a.I) * sizeof(float));
  return b;
}

// The two GEMMs of a call; the scratch addresses are stand-ins (256, the scratch's alignment)
// when planning.
struct BlockGemms {
  launch::MoeFp8BlockGemm up, down;
};
BlockGemms block_gemms(const launch::MoeSwigluArgs& a, char* scratch) {
  const BlockScratch b = block_scratch(a);
  BlockGemms g;
  g.up.a = reinterpret_cast<const uint8_t*>(scratch + b.xq);
  g.up.a_scales = reinterpret_cast<const float*>(scratch + b.xs);
  g.up.offsets = a.offsets;
  g.up.b0 = static_cast<const uint8_t*>(a.w_gate);
  g.up.s0 = a.s_gate;
  g.up.b1 = static_cast<const uint8_t*>(a.w_up);
  g.up.s1 = a.s_up;
  g.up.R = a.R;
  g.up.E = a.E;
  g.up.N = a.I;
  g.up.K = a.D;
  g.up.h_q = reinterpret_cast<uint8_t*>(scratch + b.hq);
  g.up.h_scales = reinterpret_cast<float*>(scratch + b.hs);
  g.up.gate_up = a.gate_up;
  g.down.a = g.up.h_q;
  g.down.a_scales = g.up.h_scales;
  g.down.offsets = a.offsets;
  g.down.b0 = static_cast<const uint8_t*>(a.w_down);
  g.down.s0 = a.s_down;
  g.down.R = a.R;
  g.down.E = a.E;
  g.down.N = a.D;
  g.down.K = a.I;
  g.down.out = a.y;
  g.down.out_bf16 = a.y_bf16;
  return g;
}

bool block_supported(const launch::MoeSwigluArgs& a) {
  const BlockGemms g = block_gemms(a, reinterpret_cast<char*>(uintptr_t{256}));
  return launch::moe_fp8_block_gemm_supported(g.up) && launch::moe_fp8_block_gemm_supported(g.down);
}

void run_block(cudaStream_t stream, const launch::MoeSwigluArgs& a, void* scratch) {
  char* base = static_cast<char*>(scratch);
  const BlockGemms g = block_gemms(a, base);
  if (a.phases & 1) {
    launch::quantize_fp8_groups(stream, a.x, a.x_bf16 ? launch::Elem::kBF16 : launch::Elem::kF32,
                                a.R, a.D, const_cast<uint8_t*>(g.up.a),
                                const_cast<float*>(g.up.a_scales));
  }
  if (a.phases & 2) launch::moe_fp8_block_gemm(stream, g.up);
  if (a.phases & 4) launch::moe_fp8_block_gemm(stream, g.down);
}

}  // namespace

namespace launch {

MoeSwigluPlan moe_fp8_swiglu_plan(const MoeSwigluArgs& a, MoeGemmPath path) {
  const bool gemv = a.E <= gv8::kMaxExperts && a.R < 65536;
  // kAuto's kWgmmaFp8 plan also reserves what the largest call below it takes (the copies, up to
  // the dequantization budget): the engine sizes its workspace by a step at the largest batch
  // (core/workspace.h), so no smaller step may take more scratch than a larger one.
  size_t reserve = 0;
  if (path == MoeGemmPath::kAuto) {
    const int64_t gemv_rows = std::max(kMoeGemvAutoRows, kMoeFp8GemvRowsPerExpert * a.E);
    if (gemv && !a.batch_invariant && a.R <= gemv_rows) {
      path = MoeGemmPath::kGemv;
    } else if (!a.batch_invariant && a.R >= kMoeFp8BlockRowsPerExpert * a.E && block_supported(a)) {
      path = MoeGemmPath::kWgmmaFp8;
      MoeSwigluArgs below = a;
      below.R = kMoeFp8BlockRowsPerExpert * a.E - 1;
      if (below.R > 0) reserve = moe_fp8_swiglu_plan(below, MoeGemmPath::kAuto).scratch_bytes;
    } else {
      // The bf16 plan on the copies picks the tensor-core path (or SIMT where they cannot run).
      path = moe_swiglu_plan(chunk_args(a, true), MoeGemmPath::kAuto).path;
    }
  }
  MoeSwigluPlan plan;
  plan.path = path;
  if (path == MoeGemmPath::kGemv) {
    plan.ok = gemv;
    plan.scratch_bytes = align256(static_cast<size_t>(a.R) * a.I * sizeof(float));  // h
    return plan;
  }
  if (path == MoeGemmPath::kWgmmaFp8) {
    plan.ok = block_supported(a);
    plan.scratch_bytes = std::max(block_scratch(a).total, reserve);
    return plan;
  }
  const bool f32_copy = path == MoeGemmPath::kSimt;
  const MoeSwigluPlan inner = moe_swiglu_plan(chunk_args(a, !f32_copy), path);
  const size_t elem = f32_copy ? sizeof(float) : sizeof(bf16);
  const size_t copy = align256(static_cast<size_t>(chunk_experts(a, elem)) * a.I * a.D * elem);
  plan.ok = inner.ok;
  plan.scratch_bytes = align256(inner.scratch_bytes) + 3 * copy;
  return plan;
}

void moe_fp8_grouped_swiglu(cudaStream_t stream, const MoeSwigluArgs& a, const MoeSwigluPlan& plan,
                            void* scratch) {
  if (a.R == 0 || a.E == 0) return;
  if (plan.path == MoeGemmPath::kGemv) {
    GemmParams up;
    up.off = a.offsets;
    up.E = static_cast<int>(a.E);
    up.R = static_cast<int>(a.R);
    up.N = static_cast<int>(a.I);
    up.K = static_cast<int>(a.D);
    up.a = a.x;
    up.b0 = a.w_gate;
    up.b1 = a.w_up;
    up.h = scratch;
    up.gate_up = a.gate_up;
    GemmParams down;
    down.off = a.offsets;
    down.E = up.E;
    down.R = up.R;
    down.N = static_cast<int>(a.D);
    down.K = static_cast<int>(a.I);
    down.a = scratch;
    down.b0 = a.w_down;
    down.y = a.y;
    down.y_bf16 = a.y_bf16;
    gv8::run(stream, a, up, down);
    return;
  }
  if (plan.path == MoeGemmPath::kWgmmaFp8) return run_block(stream, a, scratch);
  const bool f32_copy = plan.path == MoeGemmPath::kSimt;
  MoeSwigluArgs b = chunk_args(a, !f32_copy);
  const MoeSwigluPlan inner = moe_swiglu_plan(b, plan.path);
  const size_t elem = f32_copy ? sizeof(float) : sizeof(bf16);
  const int64_t chunk = chunk_experts(a, elem);
  const size_t copy = align256(static_cast<size_t>(chunk) * a.I * a.D * elem);
  char* base = static_cast<char*>(scratch);
  void* inner_scratch = base;
  char* wg = base + align256(inner.scratch_bytes);
  char* wu = wg + copy;
  char* wd = wu + copy;
  for (int64_t e0 = 0; e0 < a.E; e0 += chunk) {
    const int64_t n = std::min(chunk, a.E - e0);
    if (f32_copy) {
      dequant_experts(stream, a.w_gate, a.s_gate, a.offsets, e0, n, a.R, a.I, a.D,
                      reinterpret_cast<float*>(wg));
      dequant_experts(stream, a.w_up, a.s_up, a.offsets, e0, n, a.R, a.I, a.D,
                      reinterpret_cast<float*>(wu));
      dequant_experts(stream, a.w_down, a.s_down, a.offsets, e0, n, a.R, a.D, a.I,
                      reinterpret_cast<float*>(wd));
    } else {
      dequant_experts(stream, a.w_gate, a.s_gate, a.offsets, e0, n, a.R, a.I, a.D,
                      reinterpret_cast<bf16*>(wg));
      dequant_experts(stream, a.w_up, a.s_up, a.offsets, e0, n, a.R, a.I, a.D,
                      reinterpret_cast<bf16*>(wu));
      dequant_experts(stream, a.w_down, a.s_down, a.offsets, e0, n, a.R, a.D, a.I,
                      reinterpret_cast<bf16*>(wd));
    }
    b.offsets = a.offsets + e0;
    b.E = n;
    b.w_gate = wg;
    b.w_up = wu;
    b.w_down = wd;
    moe_grouped_swiglu(stream, b, inner, inner_scratch);
  }
}

}  // namespace launch
}  // namespace loom::cuda
