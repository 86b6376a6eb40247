#include "kernels/cpu/norm.h"

#include <algorithm>
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

// rmsnorm_backward in three passes, so that dx may alias x or dout: (1) rstd of every row, (2) dw
// by column blocks, each column summed over the rows in row order (the parallel split is over
// columns, so the sum is the same whatever the thread count), (3) dx row by row, reading a row of
// x and dout entirely before writing the row of dx.
void rmsnorm_backward(const Tensor& x, const Tensor& w, float eps, float weight_offset,
                      const Tensor& dout, const Tensor& dx, const Tensor& dw, const Tensor& rstd) {
  const int64_t d = x.dim(-1);
  const int64_t n = x.numel() / d;
  const float* xp = x.data<float>();
  const float* wp = w.data<float>();
  const float* gp = dout.data<float>();
  float* dxp = dx.data<float>();
  float* dwp = dw.data<float>();
  float* rs = rstd.data<float>();
  const bool parallel = n * d > 32768;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = xp + r * d;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < d; ++i) ss += xr[i] * xr[i];
    rs[r] = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
  }
  constexpr int64_t kCols = 64;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t c0 = 0; c0 < d; c0 += kCols) {
    const int64_t c1 = std::min(d, c0 + kCols);
    float acc[kCols] = {};
    for (int64_t r = 0; r < n; ++r) {
      const float* xr = xp + r * d;
      const float* gr = gp + r * d;
      for (int64_t i = c0; i < c1; ++i) acc[i - c0] += gr[i] * (xr[i] * rs[r]);
    }
    for (int64_t i = c0; i < c1; ++i) dwp[i] += acc[i - c0];
  }
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = xp + r * d;
    const float* gr = gp + r * d;
    float* dxr = dxp + r * d;
    const float inv = rs[r];
    float dot = 0.0f;  // sum(g * xhat)
#pragma omp simd reduction(+ : dot)
    for (int64_t i = 0; i < d; ++i) dot += (weight_offset + wp[i]) * gr[i] * (xr[i] * inv);
    const float mean = dot / static_cast<float>(d);
#pragma omp simd
    for (int64_t i = 0; i < d; ++i)
      dxr[i] = inv * ((weight_offset + wp[i]) * gr[i] - (xr[i] * inv) * mean);
  }
}

// Per row, with n = sqrt(sum(x^2) + eps): dx = scale / n * (dout - x * (x . dout) / n^2). Rows are
// independent (threads split rows, each row's sums run in order).
void l2norm_backward(const Tensor& x, float eps, float scale, const Tensor& dout,
                     const Tensor& dx) {
  const int64_t d = x.dim(-1);
  const int64_t n = x.numel() / d;
  const float* xp = x.data<float>();
  const float* gp = dout.data<float>();
  float* dxp = dx.data<float>();
#pragma omp parallel for schedule(static) if (n * d > 32768)
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = xp + r * d;
    const float* gr = gp + r * d;
    float* dxr = dxp + r * d;
    float ss = 0.0f, dot = 0.0f;
#pragma omp simd reduction(+ : ss, dot)
    for (int64_t i = 0; i < d; ++i) {
      ss += xr[i] * xr[i];
      dot += xr[i] * gr[i];
    }
    const float nsq = ss + eps;
    const float mul = scale / std::sqrt(nsq);
    const float proj = dot / nsq;
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) dxr[i] = mul * (gr[i] - xr[i] * proj);
  }
}

}  // namespace loom::cpu
