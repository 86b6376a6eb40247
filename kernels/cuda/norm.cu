// RMSNorm and L2 norm: one block per row, a two-pass row (sum of squares, then scale); float4
// loads when the row length and pointers allow. `out` may alias `x`: every element is read by
// the same thread that later writes it, and the block reduction separates the passes.
#include "kernels/cuda/common.cuh"

namespace loom::cuda {
namespace {

template <bool kRms, bool kVec>
__global__ void __launch_bounds__(256)
    norm_kernel(const float* __restrict__ x, const float* __restrict__ w, float* out, int64_t d,
                float eps, float p0, float p1) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * d;
  float* orow = out + row * d;
  float ss = 0.0f;
  if constexpr (kVec) {
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    for (int64_t i = threadIdx.x; i < d / 4; i += blockDim.x) {
      const float4 v = x4[i];
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else {
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) ss += xr[i] * xr[i];
  }
  ss = dev::block_sum(ss, red);
  // p0 = weight_offset (rms) or scale (l2); p1 unused.
  const float mul = kRms ? 1.0f / sqrtf(ss / static_cast<float>(d) + eps) : p0 / sqrtf(ss + eps);
  (void)p1;
  if constexpr (kVec) {
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    float4* o4 = reinterpret_cast<float4*>(orow);
    const float4* w4 = reinterpret_cast<const float4*>(w);
    for (int64_t i = threadIdx.x; i < d / 4; i += blockDim.x) {
      float4 v = x4[i];
      if constexpr (kRms) {
        const float4 ww = w4[i];
        v.x = (p0 + ww.x) * (v.x * mul);
        v.y = (p0 + ww.y) * (v.y * mul);
        v.z = (p0 + ww.z) * (v.z * mul);
        v.w = (p0 + ww.w) * (v.w * mul);
      } else {
        v.x *= mul;
        v.y *= mul;
        v.z *= mul;
        v.w *= mul;
      }
      o4[i] = v;
    }
  } else {
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
      orow[i] = kRms ? (p0 + w[i]) * (xr[i] * mul) : xr[i] * mul;
    }
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <bool kRms>
void launch_norm(cudaStream_t stream, const float* x, const float* w, float* out, int64_t rows,
                 int64_t d, float eps, float p0) {
  if (rows == 0 || d == 0) return;
  LOOM_CHECK_GRID(rows);
  const bool vec = d % 4 == 0 && aligned16(x) && aligned16(out) && (!kRms || aligned16(w));
  const int threads = d >= 2048 ? 256 : (d >= 512 ? 128 : 64);
  const dim3 grid(static_cast<unsigned>(rows));
  if (vec) {
    norm_kernel<kRms, true><<<grid, threads, 0, stream>>>(x, w, out, d, eps, p0, 0.f);
  } else {
    norm_kernel<kRms, false><<<grid, threads, 0, stream>>>(x, w, out, d, eps, p0, 0.f);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace

namespace launch {
void rmsnorm(cudaStream_t stream, const float* x, const float* w, float* out, int64_t rows,
             int64_t d, float eps, float weight_offset) {
  launch_norm<true>(stream, x, w, out, rows, d, eps, weight_offset);
}
void l2norm(cudaStream_t stream, const float* x, float* out, int64_t rows, int64_t d, float eps,
            float scale) {
  launch_norm<false>(stream, x, nullptr, out, rows, d, eps, scale);
}
}  // namespace launch

}  // namespace loom::cuda
