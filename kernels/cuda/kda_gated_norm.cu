// rmsnorm_gated (kernels/kda.h): the per-head output norm of KDA, out = RMSNorm(o) * sigmoid(gate),
// in one pass where the model ran rmsnorm_forward and then mul_sigmoid_inplace: two kernels and a
// round trip of o through memory per layer (~2 us each in a batch-1 decode step).
//
// Bits. A warp takes a row and replays kernels/cuda/norm.cu's reduction of it
// (norm_order_sum): the same per-thread partial sums of squares in the same order, the same
// shuffle trees, the same scale formula. The normalised value is rounded to out's type, as the
// separate norm stored it, before the multiply by sigmoid(gate) of kernels/cuda/elementwise.cu.
// So the result is the bits of the two separate kernels for every shape. Rows that norm.cu gives
// a block (more than 64 units) still take one warp here: it walks the block's threads' partial
// sums in turn, which is slower but exact; KDA's heads (dv <= 256) never need it.
#include "kernels/cuda/kda_fused_launch.h"
#include "kernels/cuda/norm_order.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/pdl.h"

namespace loom::cuda {
namespace {

constexpr int kWarps = 8;         // rows a block
constexpr int kMaxNormWarps = 8;  // norm_kernel's 256 threads

template <typename X, typename G, typename O, int V>
__global__ void __launch_bounds__(kWarps * 32)
    rmsnorm_gated_kernel(const X* x, const float* __restrict__ w, const G* __restrict__ gate,
                         O* out, int64_t rows, int64_t d, float eps, float p0, int nw) {
  dev::pdl_wait();  // PDL-aware (kernels/cuda/pdl.h): before any access
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= rows) return;  // uniform across the warp
  const int64_t units = d / V, stride = 32 * nw;
  const X* xr = x + row * d;
  // First pass: the partial sum of the norm's thread 32 wi + lane, for each of its nw warps.
  float part[kMaxNormWarps] = {};
#pragma unroll
  for (int wi = 0; wi < kMaxNormWarps; ++wi) {
    if (wi < nw) {
      float ss = 0.0f;
      for (int64_t u = 32 * wi + lane; u < units; u += stride) {
        float v[V];
        dev::ld_vec<V>(xr + u * V, v);
#pragma unroll
        for (int j = 0; j < V; ++j) ss += v[j] * v[j];  // as norm.cu's row_sum_squares
      }
      part[wi] = ss;
    }
  }
  const float ss = dev::norm_order_sum(part, nw, lane);
  const float mul = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
  // Second pass: this lane's units only (every element on its own), each read before written.
  const G* gr = gate + row * d;
  O* orow = out + row * d;
  for (int64_t u = lane; u < units; u += 32) {
    float v[V], ww[V];
    dev::ld_vec<V>(xr + u * V, v);
    dev::ld_vec<V>(w + u * V, ww);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float normed = dev::as_stored<O>((p0 + ww[j]) * (v[j] * mul));
      v[j] = normed * dev::sigmoid(dev::ld(gr + u * V + j));
    }
    dev::st_vec<V>(orow + u * V, v);
  }
}

}  // namespace

namespace launch {

void rmsnorm_gated(cudaStream_t stream, const void* x, bool x_bf16, const float* w,
                   const void* gate, bool gate_bf16, void* out, bool out_bf16, int64_t rows,
                   int64_t d, float eps, float weight_offset, NormOrder order) {
  if (rows == 0 || d == 0) return;
  const int64_t blocks = (rows + kWarps - 1) / kWarps;
  LOOM_CHECK_GRID(blocks);
  const int nw = order.threads / 32;
  dev::with_elem(x_bf16, [&](auto xt) {
    dev::with_elem(gate_bf16, [&](auto gt) {
      dev::with_elem(out_bf16, [&](auto ot) {
        using X = typename decltype(xt)::type;
        using G = typename decltype(gt)::type;
        using O = typename decltype(ot)::type;
        constexpr int kV = dev::kVecWidth<X, O>;
        const auto* xp = static_cast<const X*>(x);
        const auto* gp = static_cast<const G*>(gate);
        auto* op = static_cast<O*>(out);
        const dim3 grid(static_cast<unsigned>(blocks));
        if (order.vec == kV) {
          LOOM_MARK_PDL_KERNEL((rmsnorm_gated_kernel<X, G, O, kV>));
          rmsnorm_gated_kernel<X, G, O, kV>
              <<<grid, kWarps * 32, 0, stream>>>(xp, w, gp, op, rows, d, eps, weight_offset, nw);
        } else {
          LOOM_MARK_PDL_KERNEL((rmsnorm_gated_kernel<X, G, O, 1>));
          rmsnorm_gated_kernel<X, G, O, 1>
              <<<grid, kWarps * 32, 0, stream>>>(xp, w, gp, op, rows, d, eps, weight_offset, nw);
        }
      });
    });
  });
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace launch
}  // namespace loom::cuda
