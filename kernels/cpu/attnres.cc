#include "kernels/cpu/attnres.h"

#include <cmath>
#include <limits>

namespace loom::cpu {

// Contracts are checked by kernels/attnres.cc. The softmax over depth is taken online (a running
// maximum rescales the running sum), so a row needs no per-source storage and the step allocates
// nothing however many blocks the model has.
void attnres_aggregate(const Tensor& sources, const Tensor& query, const Tensor& key_norm,
                       const Tensor& out_norm, float eps, const Tensor& out) {
  const int64_t m = sources.dim(0), n = sources.dim(1), d = sources.dim(2);
  const float* src = sources.data<float>();
  const float* w = query.data<float>();
  const float* r = key_norm.data<float>();
  const float* o = out_norm.data<float>();
#pragma omp parallel for schedule(static) if (n * d * m > 32768)
  for (int64_t t = 0; t < n; ++t) {
    float* dst = out.data<float>() + t * d;
    float mx = -std::numeric_limits<float>::infinity(), z = 0.0f;
    for (int64_t i = 0; i < m; ++i) {
      const float* v = src + (i * n + t) * d;
      float ss = 0.0f, dot = 0.0f;
      for (int64_t j = 0; j < d; ++j) ss += v[j] * v[j];
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
      for (int64_t j = 0; j < d; ++j) dot += (v[j] * inv) * r[j] * w[j];
      if (i == 0) {
        mx = dot;
        z = 1.0f;
        for (int64_t j = 0; j < d; ++j) dst[j] = v[j];
        continue;
      }
      if (dot > mx) {
        const float scale = std::exp(mx - dot);
        z *= scale;
        for (int64_t j = 0; j < d; ++j) dst[j] *= scale;
        mx = dot;
      }
      const float p = std::exp(dot - mx);
      z += p;
      for (int64_t j = 0; j < d; ++j) dst[j] += p * v[j];
    }
    const float inv_z = 1.0f / z;
    float ss = 0.0f;
    for (int64_t j = 0; j < d; ++j) {
      dst[j] *= inv_z;
      ss += dst[j] * dst[j];
    }
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
    for (int64_t j = 0; j < d; ++j) dst[j] = dst[j] * inv * o[j];
  }
}

}  // namespace loom::cpu
