#include "kernels/cpu/norm.h"

#include <cmath>

namespace loom::cpu {

void rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, float weight_offset,
                     const Tensor& out) {
  LOOM_CHECK_F32(x);
  LOOM_CHECK_F32(w);
  LOOM_CHECK_F32(out);
  const int64_t d = x.dim(-1);
  const int64_t n = x.numel() / d;
  LOOM_CHECK(w.numel() == d && out.shape() == x.shape(), "rmsnorm: x %s w %s out %s",
             x.describe().c_str(), w.describe().c_str(), out.describe().c_str());
  const float* xp = x.data<float>();
  const float* wp = w.data<float>();
  float* op = out.data<float>();
#pragma omp parallel for schedule(static) if (n * d > 32768)
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = xp + r * d;
    float* orow = op + r * d;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < d; ++i) ss += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) orow[i] = (weight_offset + wp[i]) * (xr[i] * inv);
  }
}

void l2norm_forward(const Tensor& x, float eps, float scale, const Tensor& out) {
  LOOM_CHECK_F32(x);
  LOOM_CHECK_F32(out);
  LOOM_CHECK(out.shape() == x.shape(), "l2norm: x %s out %s", x.describe().c_str(),
             out.describe().c_str());
  const int64_t d = x.dim(-1);
  const int64_t n = x.numel() / d;
  const float* xp = x.data<float>();
  float* op = out.data<float>();
#pragma omp parallel for schedule(static) if (n * d > 32768)
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = xp + r * d;
    float* orow = op + r * d;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < d; ++i) ss += xr[i] * xr[i];
    const float mul = scale / std::sqrt(ss + eps);
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) orow[i] = xr[i] * mul;
  }
}

}  // namespace loom::cpu
