#include "kernels/cpu/attnres.h"

#include <algorithm>
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

namespace {
constexpr int64_t kTokenBlock = 16;  // tokens per parameter-gradient partial sum
}

// Per block of tokens: the three [D] parameter-gradient partials, then m, dm and du ([D] each),
// then s, 1/rms, p and dp ([S] each).
Shape attnres_backward_scratch(int64_t s, int64_t n, int64_t d) {
  return Shape{(n + kTokenBlock - 1) / kTokenBlock, 6 * d + 4 * s};
}

// Threads split fixed blocks of kTokenBlock tokens; each block sums its tokens' parameter
// gradients in token order into its own partials, and the partials are added in block order at
// the end, so the result is the same whatever the thread count. Per token the forward is
// recomputed (a plain softmax over the S logits, which are kept: S is the number of blocks + 1).
void attnres_aggregate_backward(const Tensor& sources, const Tensor& query, const Tensor& key_norm,
                                const Tensor& out_norm, float eps, const Tensor& dout,
                                const Tensor& dsources, const Tensor& dquery,
                                const Tensor& dkey_norm, const Tensor& dout_norm,
                                const Tensor& scratch) {
  const int64_t m = sources.dim(0), n = sources.dim(1), d = sources.dim(2);
  const int64_t nblk = (n + kTokenBlock - 1) / kTokenBlock, row = 6 * d + 4 * m;
  const float fd = static_cast<float>(d);
  const float* src = sources.data<float>();
  const float* w = query.data<float>();
  const float* r = key_norm.data<float>();
  const float* o = out_norm.data<float>();
  const float* gout = dout.data<float>();
  float* dsrc = dsources.data<float>();
#pragma omp parallel for schedule(static) if (n * d * m > 32768)
  for (int64_t blk = 0; blk < nblk; ++blk) {
    float* part_w = scratch.data<float>() + blk * row;  // dquery partial
    float* part_r = part_w + d;                         // dkey_norm partial
    float* part_o = part_r + d;                         // dout_norm partial
    float* mix = part_o + d;
    float* dm = mix + d;
    float* du = dm + d;
    float* logit = du + d;
    float* inv = logit + m;
    float* p = inv + m;
    float* dp = p + m;
    for (int64_t j = 0; j < 3 * d; ++j) part_w[j] = 0.0f;
    for (int64_t t = blk * kTokenBlock; t < std::min(n, (blk + 1) * kTokenBlock); ++t) {
      // Forward: logits, softmax over depth, the mix m and its norm.
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t i = 0; i < m; ++i) {
        const float* v = src + (i * n + t) * d;
        float ss = 0.0f, dot = 0.0f;
        for (int64_t j = 0; j < d; ++j) ss += v[j] * v[j];
        inv[i] = 1.0f / std::sqrt(ss / fd + eps);
        for (int64_t j = 0; j < d; ++j) dot += (v[j] * inv[i]) * r[j] * w[j];
        logit[i] = dot;
        mx = std::max(mx, dot);
      }
      float z = 0.0f;
      for (int64_t i = 0; i < m; ++i) z += (p[i] = std::exp(logit[i] - mx));
      for (int64_t i = 0; i < m; ++i) p[i] /= z;
      for (int64_t j = 0; j < d; ++j) mix[j] = 0.0f;
      for (int64_t i = 0; i < m; ++i) {
        const float* v = src + (i * n + t) * d;
        for (int64_t j = 0; j < d; ++j) mix[j] += p[i] * v[j];
      }
      float ss = 0.0f;
      for (int64_t j = 0; j < d; ++j) ss += mix[j] * mix[j];
      const float inv_m = 1.0f / std::sqrt(ss / fd + eps);
      // Through the output norm: dout_norm and dm.
      const float* g = gout + t * d;
      float gm = 0.0f;  // sum(g * o * mhat)
      for (int64_t j = 0; j < d; ++j) {
        const float mhat = mix[j] * inv_m;
        part_o[j] += g[j] * mhat;
        gm += g[j] * o[j] * mhat;
      }
      for (int64_t j = 0; j < d; ++j) dm[j] = inv_m * (g[j] * o[j] - mix[j] * inv_m * (gm / fd));
      // Through the softmax: dp_i = dm . v_i, ds_i = p_i (dp_i - sum_k p_k dp_k).
      float pdp = 0.0f;
      for (int64_t i = 0; i < m; ++i) {
        const float* v = src + (i * n + t) * d;
        float dot = 0.0f;
        for (int64_t j = 0; j < d; ++j) dot += dm[j] * v[j];
        dp[i] = dot;
        pdp += p[i] * dot;
      }
      // Into the sources (v_i read at j before dv_i is written at j) and u = r * w.
      for (int64_t j = 0; j < d; ++j) du[j] = 0.0f;
      for (int64_t i = 0; i < m; ++i) {
        const float ds = p[i] * (dp[i] - pdp);
        const float* v = src + (i * n + t) * d;
        float* dv = dsrc + (i * n + t) * d;
        const float k = logit[i] * inv[i] / fd;
        for (int64_t j = 0; j < d; ++j) {
          const float vj = v[j];
          du[j] += ds * (vj * inv[i]);
          dv[j] = p[i] * dm[j] + ds * inv[i] * (r[j] * w[j] - k * vj);
        }
      }
      for (int64_t j = 0; j < d; ++j) {
        part_w[j] += du[j] * r[j];
        part_r[j] += du[j] * w[j];
      }
    }
  }
  float* dw = dquery.data<float>();
  float* dr = dkey_norm.data<float>();
  float* dov = dout_norm.data<float>();
  for (int64_t j = 0; j < d; ++j) {
    float sw = 0.0f, sr = 0.0f, so = 0.0f;
    for (int64_t blk = 0; blk < nblk; ++blk) {
      const float* part = scratch.data<float>() + blk * row;
      sw += part[j];
      sr += part[d + j];
      so += part[2 * d + j];
    }
    dw[j] += sw;
    dr[j] += sr;
    dov[j] += so;
  }
}

}  // namespace loom::cpu
