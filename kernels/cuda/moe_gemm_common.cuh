// Pieces the grouped SwiGLU's GEMM kernels share (kernels/cuda/moe_gemm.cu with the bf16 and f32
// weight paths, kernels/cuda/moe_fp8.cu with the FP8 ones): the tile schedule over the experts'
// rows (find_tile), the parameters of one GEMM launch and the common epilogue. Device code only
// (included by .cu files).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace loom::cuda::moe_gemm {

using bf16 = __nv_bfloat16;
constexpr unsigned kFull = 0xffffffffu;

// ---- tile schedule -----------------------------------------------------------------------------

struct Tile {
  int e = -1;       // owned expert
  int row0 = 0;     // first row of the tile
  int row_end = 0;  // the expert's end row (rows of the tile at or past it are missing)
};

// Row tile `slot` of the concatenation of every expert's ceil(n_e / BM) tiles; e = -1 past the
// last. Run by every warp of the block (the same answer in all, no shared memory).
__device__ __forceinline__ Tile find_tile(const int32_t* __restrict__ off, int E, int R, int slot,
                                          int BM) {
  const int lane = threadIdx.x & 31;
  int base = 0;
  for (int e0 = 0; e0 < E; e0 += 32) {
    const int e = e0 + lane;
    int lo = 0, hi = 0;
    if (e < E) {
      lo = min(max(off[e], 0), R);
      hi = min(max(off[e + 1], lo), R);
    }
    const int n = (hi - lo + BM - 1) / BM;
    int incl = n;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(kFull, incl, o);
      if (lane >= o) incl += v;
    }
    const int total = __shfl_sync(kFull, incl, 31);
    if (slot < base + total) {
      const int L = __ffs(__ballot_sync(kFull, base + incl > slot)) - 1;
      const int incl_l = __shfl_sync(kFull, incl, L), n_l = __shfl_sync(kFull, n, L);
      const int lo_l = __shfl_sync(kFull, lo, L), hi_l = __shfl_sync(kFull, hi, L);
      Tile t;
      t.e = e0 + L;
      t.row0 = lo_l + (slot - (base + incl_l - n_l)) * BM;
      t.row_end = hi_l;
      return t;
    }
    base += total;
  }
  return Tile{};
}

// The same tile for a block of kThreads threads and at most kThreads experts: thread e counts
// expert e's tiles (offsets clamped as find_tile clamps them), one block scan, and the thread whose
// tiles hold the slot publishes it. One round of loads and one scan where find_tile scans the
// offsets 32 experts at a time in every warp. Called by every thread of the block (it
// synchronises).
template <int kThreads>
__device__ __forceinline__ Tile find_tile_block(const int32_t* __restrict__ off, int E, int R,
                                                int slot, int BM) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024);
  __shared__ int warp_total[kThreads / 32];
  __shared__ int4 found;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  int lo = 0, hi = 0;
  if (tid < E) {
    lo = min(max(off[tid], 0), R);
    hi = min(max(off[tid + 1], lo), R);
  }
  const int n = (hi - lo + BM - 1) / BM;
  int incl = n;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(kFull, incl, o);
    if (lane >= o) incl += v;
  }
  if (lane == 31) warp_total[warp] = incl;
  if (tid == 0) found = make_int4(-1, 0, 0, 0);
  __syncthreads();
  int first = incl - n;
  for (int w = 0; w < warp; ++w) first += warp_total[w];
  if (n > 0 && slot >= first && slot < first + n)
    found = make_int4(tid, lo + (slot - first) * BM, hi, 0);
  __syncthreads();
  Tile t;
  t.e = found.x, t.row0 = found.y, t.row_end = found.z;
  return t;
}

// The launch's row-tile slots: an upper bound of sum_e ceil(n_e / BM).
inline int64_t row_slots(int64_t R, int64_t E, int BM) { return (R + BM - 1) / BM + E; }

// ---- shared helpers ----------------------------------------------------------------------------

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Parameters of one GEMM launch: out[rows of e, N] from a [R, K] and expert e's b [N, K].
// kDual (gate/up): b0 = W_gate, b1 = W_up, N = I, out h [R, I] (and gate_up [2, R, I]);
// else (down): b0 = W_down, N = D, out y [R, D].
struct GemmParams {
  const void* a = nullptr;
  const void* b0 = nullptr;
  const void* b1 = nullptr;
  const int32_t* off = nullptr;
  int E = 0, R = 0, N = 0, K = 0, ntn = 0;  // ntn: column tiles
  void* h = nullptr;
  float* gate_up = nullptr;
  void* y = nullptr;
  bool y_bf16 = false;  // one flag for the whole launch: a uniform branch in the epilogue
  // The GEMV path (moe_gemm.cu, gv): the gate/up launch writes each row-tile slot's tile here
  // (int4 {e, row0, row_end, 0}) and the down launch of the same call reads it back instead of
  // searching the offsets again (null: each block searches).
  int4* tiles_out = nullptr;
  const int4* tiles_in = nullptr;
};

// The epilogue of every path: output columns [col, col + W) of row `row`, W = 2 on the
// tensor-core paths (N % 8 == 0 keeps a pair inside the row and 8-byte aligned), 1 on the SIMT
// path. Gate/up (kDual): h = silu(g) * u into p.h (element type H), and g, u into gate_up when
// kept; down: g is y's (u is unused), f32 or bf16 as p.y_bf16 says.
template <bool kDual, int W, typename H>
__device__ __forceinline__ void store_out(const GemmParams& p, int row, int col,
                                          const float (&g)[W], const float (&u)[W]) {
  static_assert(W == 1 || W == 2, "one element or a pair");
  const int64_t i = static_cast<int64_t>(row) * p.N + col;
  const auto put_f32 = [](float* dst, const float(&v)[W]) {
    if constexpr (W == 2) {
      *reinterpret_cast<float2*>(dst) = make_float2(v[0], v[1]);
    } else {
      *dst = v[0];
    }
  };
  const auto put_bf16 = [](bf16* dst, const float(&v)[W]) {
    if constexpr (W == 2) {
      *reinterpret_cast<uint32_t*>(dst) = pack_bf16(v[0], v[1]);
    } else {
      *dst = __float2bfloat16_rn(v[0]);
    }
  };
  if constexpr (!kDual) {
    if (p.y_bf16) {
      put_bf16(static_cast<bf16*>(p.y) + i, g);
    } else {
      put_f32(static_cast<float*>(p.y) + i, g);
    }
  } else {
    float h[W];
#pragma unroll
    for (int w = 0; w < W; ++w) h[w] = dev::silu(g[w]) * u[w];
    if constexpr (sizeof(H) == 2) {
      put_bf16(static_cast<bf16*>(p.h) + i, h);
    } else {
      put_f32(static_cast<float*>(p.h) + i, h);
    }
    if (p.gate_up) {
      put_f32(p.gate_up + i, g);
      put_f32(p.gate_up + static_cast<int64_t>(p.R) * p.N + i, u);
    }
  }
}

}  // namespace loom::cuda::moe_gemm
