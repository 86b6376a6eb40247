// The row reduction of kernels/cuda/norm.cu as one warp can replay it (nvcc only), for fused
// kernels that normalise rows and must give the separate norm's bits: the same partial sums in the
// same order, then the same shuffle trees. launch::norm_order (kernels/cuda/kda_fused_launch.h)
// says which reduction the separate norm takes for a row.
#pragma once

#include <type_traits>

#include "kernels/cuda/bf16_io.cuh"

namespace loom::cuda::dev {

// The separate norm's row sum from per-thread partial sums held by one warp: partial[w] on lane l
// is the partial of the norm's thread 32 w + l, for its nw = threads / 32 warps a row. nw == 1 is
// norm_warp_kernel's warp_sum; nw > 1 is norm_kernel's block_sum, a warp_sum per warp, then one
// over the warps' totals on lanes 0 .. nw-1 and zeros on the others. A warp_sum leaves the same
// bits on every lane (each lane adds the same two values), so any lane's total is the block's.
// Call from all 32 lanes.
template <int kMaxWarps>
__device__ __forceinline__ float norm_order_sum(const float (&partial)[kMaxWarps], int nw,
                                                int lane) {
  if (nw == 1) return warp_sum(partial[0]);
  float mine = 0.0f;
#pragma unroll
  for (int w = 0; w < kMaxWarps; ++w) {
    if (w < nw) {
      const float t = warp_sum(partial[w]);
      if (lane == w) mine = t;
    }
  }
  return warp_sum(mine);
}

// x as a T would hold it: itself for f32, rounded to nearest even bf16 and widened back for bf16
// (what a separate kernel reads back after storing x into a T array).
template <typename T>
__device__ __forceinline__ float as_stored(float x) {
  if constexpr (std::is_same_v<T, bf16>) {
    return __bfloat162float(__float2bfloat16_rn(x));
  } else {
    return x;
  }
}

}  // namespace loom::cuda::dev
