// RMSNorm and L2 norm: one block per row (a warp per row for rows of at most kWarpRowUnits
// units: the per-head norms of KDA and GDN, 128 elements, where a block per row spent most of its
// time being scheduled: 160 us for 262,144 rows of 128 bf16 in an 8192-token prefill, 5x the
// copy time; ncu, s18a), a two-pass row (sum of squares, then scale). x and out are each f32 or
// bf16; the arithmetic is f32. Rows move in 16-byte units (4 f32 or 8 bf16
// elements; 8 when either side is bf16) when the row length and pointers allow, else one element
// at a time. `out` may alias `x` when both have the same type: every element is read by the same
// thread that later writes it, and the block (or warp) reduction separates the passes.
#include "kernels/cuda/bf16_io.cuh"

namespace loom::cuda {
namespace {

// The two passes over one row, shared by both kernels: the units first, first + stride, ... of
// this thread (V elements per unit, 1: scalar; V divides d), then the thread's reduction.
template <typename X, int V>
__device__ __forceinline__ float row_sum_squares(const X* xr, int64_t units, int64_t first,
                                                 int64_t stride) {
  float ss = 0.0f;
  for (int64_t u = first; u < units; u += stride) {
    float v[V];
    dev::ld_vec<V>(xr + u * V, v);
#pragma unroll
    for (int j = 0; j < V; ++j) ss += v[j] * v[j];
  }
  return ss;
}

// p0 = weight_offset (rms) or scale (l2); ss the row's sum of squares.
template <bool kRms, typename X, typename O, int V>
__device__ __forceinline__ void scale_row(const X* xr, const float* __restrict__ w, O* orow,
                                          int64_t units, int64_t first, int64_t stride, int64_t d,
                                          float ss, float eps, float p0) {
  const float mul = kRms ? 1.0f / sqrtf(ss / static_cast<float>(d) + eps) : p0 / sqrtf(ss + eps);
  for (int64_t u = first; u < units; u += stride) {
    float v[V];
    dev::ld_vec<V>(xr + u * V, v);
    if constexpr (kRms) {
      float ww[V];
      dev::ld_vec<V>(w + u * V, ww);
#pragma unroll
      for (int j = 0; j < V; ++j) v[j] = (p0 + ww[j]) * (v[j] * mul);
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) v[j] *= mul;
    }
    dev::st_vec<V>(orow + u * V, v);
  }
}

// A block per row.
template <bool kRms, typename X, typename O, int V>
__global__ void __launch_bounds__(256)
    norm_kernel(const X* x, const float* __restrict__ w, O* out, int64_t d, float eps, float p0) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x, units = d / V;
  const float ss =
      dev::block_sum(row_sum_squares<X, V>(x + row * d, units, threadIdx.x, blockDim.x), red);
  scale_row<kRms, X, O, V>(x + row * d, w, out + row * d, units, threadIdx.x, blockDim.x, d, ss,
                           eps, p0);
}

// Rows of at most this many units take a warp each.
constexpr int64_t kWarpRowUnits = 64;
constexpr int kWarpRowWarps = 8;

// A warp per row, kWarpRowWarps rows a block; lane l takes units l, l + 32, ...
template <bool kRms, typename X, typename O, int V>
__global__ void __launch_bounds__(kWarpRowWarps * 32)
    norm_warp_kernel(const X* x, const float* __restrict__ w, O* out, int64_t rows, int64_t d,
                     float eps, float p0) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpRowWarps + (threadIdx.x >> 5);
  if (row >= rows) return;  // uniform across the warp
  const int64_t units = d / V;
  const float ss = dev::warp_sum(row_sum_squares<X, V>(x + row * d, units, lane, 32));
  scale_row<kRms, X, O, V>(x + row * d, w, out + row * d, units, lane, 32, d, ss, eps, p0);
}

template <bool kRms>
void launch_norm(cudaStream_t stream, const void* x, bool x_bf16, const float* w, void* out,
                 bool out_bf16, int64_t rows, int64_t d, float eps, float p0) {
  if (rows == 0 || d == 0) return;
  const int threads = d >= 2048 ? 256 : (d >= 512 ? 128 : 64);
  const dim3 grid(static_cast<unsigned>(rows));
  dev::with_elem(x_bf16, [&](auto xt) {
    dev::with_elem(out_bf16, [&](auto ot) {
      using X = typename decltype(xt)::type;
      using O = typename decltype(ot)::type;
      constexpr int kV = dev::kVecWidth<X, O>;
      const X* xp = static_cast<const X*>(x);
      O* op = static_cast<O*>(out);
      const bool vec =
          d % kV == 0 && dev::aligned16(x) && dev::aligned16(out) && (!kRms || dev::aligned16(w));
      const int64_t units = vec ? d / kV : d;
      if (units <= kWarpRowUnits) {
        const int64_t blocks = (rows + kWarpRowWarps - 1) / kWarpRowWarps;
        LOOM_CHECK_GRID(blocks);
        const dim3 wgrid(static_cast<unsigned>(blocks));
        if (vec) {
          norm_warp_kernel<kRms, X, O, kV>
              <<<wgrid, kWarpRowWarps * 32, 0, stream>>>(xp, w, op, rows, d, eps, p0);
        } else {
          norm_warp_kernel<kRms, X, O, 1>
              <<<wgrid, kWarpRowWarps * 32, 0, stream>>>(xp, w, op, rows, d, eps, p0);
        }
      } else if (vec) {
        LOOM_CHECK_GRID(rows);
        norm_kernel<kRms, X, O, kV><<<grid, threads, 0, stream>>>(xp, w, op, d, eps, p0);
      } else {
        LOOM_CHECK_GRID(rows);
        norm_kernel<kRms, X, O, 1><<<grid, threads, 0, stream>>>(xp, w, op, d, eps, p0);
      }
    });
  });
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace

namespace launch {
void rmsnorm(cudaStream_t stream, const void* x, bool x_bf16, const float* w, void* out,
             bool out_bf16, int64_t rows, int64_t d, float eps, float weight_offset) {
  launch_norm<true>(stream, x, x_bf16, w, out, out_bf16, rows, d, eps, weight_offset);
}
void l2norm(cudaStream_t stream, const void* x, bool x_bf16, void* out, bool out_bf16, int64_t rows,
            int64_t d, float eps, float scale) {
  launch_norm<false>(stream, x, x_bf16, nullptr, out, out_bf16, rows, d, eps, scale);
}
}  // namespace launch

}  // namespace loom::cuda
