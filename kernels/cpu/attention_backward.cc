#include "kernels/cpu/attention_backward.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace loom::cpu {
namespace {

// Row-major [T, H, w] tensors: the w values of token t, head h.
struct Heads {
  float* base;
  int64_t H, w;
  float* at(int64_t t, int64_t h) const { return base + (t * H + h) * w; }
};

float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

void causal_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                              const Tensor& out, const Tensor& lse) {
  const int64_t T = q.dim(0), Hq = q.dim(1), Hkv = k.dim(1), d = q.dim(2), dv = v.dim(2);
  const int64_t group = Hq / Hkv;
  const Heads Q{q.data<float>(), Hq, d}, K{k.data<float>(), Hkv, d}, V{v.data<float>(), Hkv, dv},
      O{out.data<float>(), Hq, dv};
  float* L = lse.data<float>();
#pragma omp parallel if (Hq * T * T * (d + dv) > 65536)
  {
    std::vector<float> s(T);
#pragma omp for schedule(dynamic, 1) collapse(2)
    for (int64_t h = 0; h < Hq; ++h) {
      for (int64_t i = 0; i < T; ++i) {
        const int64_t hk = h / group;
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j <= i; ++j) {
          s[j] = scale * dot(Q.at(i, h), K.at(j, hk), d);
          m = std::max(m, s[j]);
        }
        float z = 0.0f;
        for (int64_t j = 0; j <= i; ++j) z += (s[j] = std::exp(s[j] - m));
        float* o = O.at(i, h);
        std::fill(o, o + dv, 0.0f);
        for (int64_t j = 0; j <= i; ++j) {
          const float p = s[j] / z;
          const float* vj = V.at(j, hk);
          for (int64_t c = 0; c < dv; ++c) o[c] += p * vj[c];
        }
        L[i * Hq + h] = m + std::log(z);
      }
    }
  }
}

void causal_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                               const Tensor& lse, const Tensor& d_out, float scale,
                               const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  const int64_t T = q.dim(0), Hq = q.dim(1), Hkv = k.dim(1), d = q.dim(2), w = v.dim(2);
  const int64_t group = Hq / Hkv;
  const Heads Q{q.data<float>(), Hq, d}, K{k.data<float>(), Hkv, d}, V{v.data<float>(), Hkv, w},
      O{out.data<float>(), Hq, w}, dO{d_out.data<float>(), Hq, w}, dQ{dq.data<float>(), Hq, d},
      dK{dk.data<float>(), Hkv, d}, dV{dv.data<float>(), Hkv, w};
  const float* L = lse.data<float>();
  // One thread per kv head: it alone writes that head's dk and dv, summing its query heads in
  // order, and the dq of those query heads.
#pragma omp parallel for schedule(dynamic, 1) if (Hq * T * T * (d + w) > 65536)
  for (int64_t hk = 0; hk < Hkv; ++hk) {
    for (int64_t j = 0; j < T; ++j) {
      std::fill(dK.at(j, hk), dK.at(j, hk) + d, 0.0f);
      std::fill(dV.at(j, hk), dV.at(j, hk) + w, 0.0f);
    }
    for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
      for (int64_t i = 0; i < T; ++i) {
        const float* qi = Q.at(i, h);
        const float* doi = dO.at(i, h);
        // D_i = dO_i . O_i = sum_j p_ij (dO_i . v_j): the softmax's backward subtracts it.
        const float D = dot(doi, O.at(i, h), w);
        const float l = L[i * Hq + h];
        float* dqi = dQ.at(i, h);
        std::fill(dqi, dqi + d, 0.0f);
        for (int64_t j = 0; j <= i; ++j) {
          const float* kj = K.at(j, hk);
          const float p = std::exp(scale * dot(qi, kj, d) - l);
          const float ds = p * (dot(doi, V.at(j, hk), w) - D) * scale;
          float* dkj = dK.at(j, hk);
          float* dvj = dV.at(j, hk);
          for (int64_t c = 0; c < d; ++c) {
            dqi[c] += ds * kj[c];
            dkj[c] += ds * qi[c];
          }
          for (int64_t c = 0; c < w; ++c) dvj[c] += p * doi[c];
        }
      }
    }
  }
}

}  // namespace loom::cpu
