#include "kernels/cpu/attnres.h"

#include <algorithm>
#include <cmath>

namespace loom::cpu {

void attnres_aggregate(const std::vector<Tensor>& sources, const Tensor& query,
                       const Tensor& key_norm, const Tensor& out_norm, float eps,
                       const Tensor& out) {
  LOOM_CHECK(!sources.empty(), "attnres_aggregate: no sources");
  LOOM_CHECK_F32(out);
  const int64_t n = out.dim(0), d = out.dim(1);
  for (const Tensor& s : sources) {
    LOOM_CHECK_F32(s);
    LOOM_CHECK(s.shape() == out.shape(), "attnres source %s vs out %s", s.describe().c_str(),
               out.describe().c_str());
  }
  for (const Tensor* t : {&query, &key_norm, &out_norm}) {
    LOOM_CHECK_F32(*t);
    LOOM_CHECK(t->numel() == d, "attnres weight %s for D = %lld", t->describe().c_str(),
               static_cast<long long>(d));
  }
  const size_t m = sources.size();
  const float* w = query.data<float>();
  const float* r = key_norm.data<float>();
  const float* o = out_norm.data<float>();
#pragma omp parallel for schedule(static) if (n * d * static_cast <int64_t>(m) > 32768)
  for (int64_t t = 0; t < n; ++t) {
    std::vector<float> logit(m);
    for (size_t i = 0; i < m; ++i) {
      const float* v = sources[i].data<float>() + t * d;
      float ss = 0.0f, dot = 0.0f;
      for (int64_t j = 0; j < d; ++j) ss += v[j] * v[j];
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
      for (int64_t j = 0; j < d; ++j) dot += (v[j] * inv) * r[j] * w[j];
      logit[i] = dot;
    }
    const float mx = *std::max_element(logit.begin(), logit.end());
    float z = 0.0f;
    for (float& l : logit) {
      l = std::exp(l - mx);
      z += l;
    }
    float* dst = out.data<float>() + t * d;
    std::fill(dst, dst + d, 0.0f);
    for (size_t i = 0; i < m; ++i) {
      const float p = logit[i] / z;
      const float* v = sources[i].data<float>() + t * d;
      for (int64_t j = 0; j < d; ++j) dst[j] += p * v[j];
    }
    float ss = 0.0f;
    for (int64_t j = 0; j < d; ++j) ss += dst[j] * dst[j];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
    for (int64_t j = 0; j < d; ++j) dst[j] = dst[j] * inv * o[j];
  }
}

}  // namespace loom::cpu
