// RMSNorm and L2 norm: one block per row (a warp per row for rows of at most kWarpRowUnits
// units: the per-head norms of KDA and GDN, 128 elements, where a block per row spent most of its
// time being scheduled: 160 us for 262,144 rows of 128 bf16 in an 8192-token prefill, 5x the
// copy time; ncu, s18a), a two-pass row (sum of squares, then scale). x and out are each f32 or
// bf16; the arithmetic is f32. Rows move in 16-byte units (4 f32 or 8 bf16
// elements; 8 when either side is bf16) when the row length and pointers allow, else one element
// at a time. `out` may alias `x` when both have the same type: every element is read by the same
// thread that later writes it, and the block (or warp) reduction separates the passes.
//
// add_rmsnorm (A != void) first adds a residual delta into x in the first pass (x += delta, stored
// rounded as x's type, and the stored value squared), so the layer's residual add and the next
// sublayer's pre-norm are one kernel instead of two: a decode step of a 27-layer model ran 54
// adds of ~1.9 us each (ncu, s19a). Each element is added, stored and squared by the thread that
// the plain norm would have squared it with, in the same order, so the result is the bits of
// add_inplace followed by rmsnorm whenever the vector width is the same (delta's dtype is out's).
#include <type_traits>

#include "kernels/cuda/bf16_io.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/pdl.h"

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

// The first pass of add_rmsnorm: x += a over this thread's units (the sum rounded into x's type
// and squared as stored, which is what the plain pass would read back).
template <typename X, typename A, int V>
__device__ __forceinline__ float row_add_sum_squares(X* xr, const A* ar, int64_t units,
                                                     int64_t first, int64_t stride) {
  float ss = 0.0f;
  for (int64_t u = first; u < units; u += stride) {
    float v[V], a[V];
    dev::ld_vec<V>(xr + u * V, v);
    dev::ld_vec<V>(ar + u * V, a);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      v[j] = v[j] + a[j];
      if constexpr (std::is_same_v<X, dev::bf16>)
        v[j] = __bfloat162float(__float2bfloat16_rn(v[j]));
    }
    dev::st_vec<V>(xr + u * V, v);
#pragma unroll
    for (int j = 0; j < V; ++j) ss += v[j] * v[j];
  }
  return ss;
}

// This thread's share of the first pass: the plain sum of squares, or the add's (A != void).
// x and add are the row's first elements (add: the delta's whole array, at element offset `at`).
template <typename X, typename A, int V>
__device__ __forceinline__ float first_pass(const X* x, const void* add, int64_t at, int64_t units,
                                            int64_t first, int64_t stride) {
  if constexpr (std::is_void_v<A>) {
    return row_sum_squares<X, V>(x, units, first, stride);
  } else {
    return row_add_sum_squares<X, A, V>(const_cast<X*>(x), static_cast<const A*>(add) + at, units,
                                        first, stride);
  }
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

// A block per row. `add` (A's type; A = void: none) is add_rmsnorm's delta.
template <bool kRms, typename X, typename O, int V, typename A = void>
__global__ void __launch_bounds__(256)
    norm_kernel(const X* x, const float* __restrict__ w, O* out, int64_t d, float eps, float p0,
                const void* add = nullptr) {
  dev::pdl_wait();  // PDL-aware (kernels/cuda/pdl.h): before any access
  __shared__ float red[32];
  const int64_t row = blockIdx.x, units = d / V;
  const float ss = dev::block_sum(
      first_pass<X, A, V>(x + row * d, add, row * d, units, threadIdx.x, blockDim.x), red);
  scale_row<kRms, X, O, V>(x + row * d, w, out + row * d, units, threadIdx.x, blockDim.x, d, ss,
                           eps, p0);
}

// Rows of at most this many units take a warp each.
constexpr int64_t kWarpRowUnits = 64;
constexpr int kWarpRowWarps = 8;

// A warp per row, kWarpRowWarps rows a block; lane l takes units l, l + 32, ...
template <bool kRms, typename X, typename O, int V, typename A = void>
__global__ void __launch_bounds__(kWarpRowWarps * 32)
    norm_warp_kernel(const X* x, const float* __restrict__ w, O* out, int64_t rows, int64_t d,
                     float eps, float p0, const void* add = nullptr) {
  dev::pdl_wait();  // PDL-aware (kernels/cuda/pdl.h): before any access
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpRowWarps + (threadIdx.x >> 5);
  if (row >= rows) return;  // uniform across the warp
  const int64_t units = d / V;
  const float ss = dev::warp_sum(first_pass<X, A, V>(x + row * d, add, row * d, units, lane, 32));
  scale_row<kRms, X, O, V>(x + row * d, w, out + row * d, units, lane, 32, d, ss, eps, p0);
}

template <typename X, typename O, typename A>
constexpr int norm_vec_width() {
  if constexpr (std::is_void_v<A>) {
    return dev::kVecWidth<X, O>;
  } else {
    return dev::kVecWidth<X, O, A>;
  }
}

// add (A's type, A = void: none): add_rmsnorm's delta. The vector width counts A's type too, so
// an f32 norm with a bf16 delta moves 8-element units (the plain f32 norm's are 4).
template <bool kRms, typename A = void>
void launch_norm(cudaStream_t stream, const void* x, bool x_bf16, const float* w, void* out,
                 bool out_bf16, int64_t rows, int64_t d, float eps, float p0,
                 const void* add = nullptr) {
  if (rows == 0 || d == 0) return;
  const int threads = d >= 2048 ? 256 : (d >= 512 ? 128 : 64);
  const dim3 grid(static_cast<unsigned>(rows));
  dev::with_elem(x_bf16, [&](auto xt) {
    dev::with_elem(out_bf16, [&](auto ot) {
      using X = typename decltype(xt)::type;
      using O = typename decltype(ot)::type;
      constexpr int kV = norm_vec_width<X, O, A>();
      const X* xp = static_cast<const X*>(x);
      O* op = static_cast<O*>(out);
      const bool vec = d % kV == 0 && dev::aligned16(x) && dev::aligned16(out) &&
                       (!kRms || dev::aligned16(w)) && (add == nullptr || dev::aligned16(add));
      const int64_t units = vec ? d / kV : d;
      if (units <= kWarpRowUnits) {
        const int64_t blocks = (rows + kWarpRowWarps - 1) / kWarpRowWarps;
        LOOM_CHECK_GRID(blocks);
        const dim3 wgrid(static_cast<unsigned>(blocks));
        if (vec) {
          LOOM_MARK_PDL_KERNEL((norm_warp_kernel<kRms, X, O, kV, A>));
          norm_warp_kernel<kRms, X, O, kV, A>
              <<<wgrid, kWarpRowWarps * 32, 0, stream>>>(xp, w, op, rows, d, eps, p0, add);
        } else {
          LOOM_MARK_PDL_KERNEL((norm_warp_kernel<kRms, X, O, 1, A>));
          norm_warp_kernel<kRms, X, O, 1, A>
              <<<wgrid, kWarpRowWarps * 32, 0, stream>>>(xp, w, op, rows, d, eps, p0, add);
        }
      } else if (vec) {
        LOOM_CHECK_GRID(rows);
        LOOM_MARK_PDL_KERNEL((norm_kernel<kRms, X, O, kV, A>));
        norm_kernel<kRms, X, O, kV, A><<<grid, threads, 0, stream>>>(xp, w, op, d, eps, p0, add);
      } else {
        LOOM_CHECK_GRID(rows);
        LOOM_MARK_PDL_KERNEL((norm_kernel<kRms, X, O, 1, A>));
        norm_kernel<kRms, X, O, 1, A><<<grid, threads, 0, stream>>>(xp, w, op, d, eps, p0, add);
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
void add_rmsnorm(cudaStream_t stream, void* x, bool x_bf16, const void* delta, bool delta_bf16,
                 const float* w, void* out, bool out_bf16, int64_t rows, int64_t d, float eps,
                 float weight_offset) {
  if (delta_bf16) {
    launch_norm<true, dev::bf16>(stream, x, x_bf16, w, out, out_bf16, rows, d, eps, weight_offset,
                                 delta);
  } else {
    launch_norm<true, float>(stream, x, x_bf16, w, out, out_bf16, rows, d, eps, weight_offset,
                             delta);
  }
}
}  // namespace launch

}  // namespace loom::cuda
