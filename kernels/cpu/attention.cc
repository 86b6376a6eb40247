// Softmax attention on the CPU. All products go through OpenBLAS sgemm (which threads itself);
// the row softmax is an OpenMP loop. Scores are materialised per chunk of queries so their
// buffer stays bounded (kScoreBudget floats) whatever the sequence length.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/gemm.h"

namespace loom::cpu {
namespace {

constexpr int64_t kScoreBudget = int64_t{8} << 20;  // floats of scores per chunk (32 MiB)

// In place over rows [0, rows) of p (row stride ld): row r holds scores of query position
// `first_len + r / rows_per_query - 1` (it may attend columns [0, len)); softmax over [0, len),
// zeros over [len, ld). Stable: subtracts the row max; f32 throughout.
void causal_softmax_rows(float* p, int64_t rows, int64_t ld, int64_t first_len,
                         int64_t rows_per_query) {
#pragma omp parallel for schedule(static) if (rows * ld > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    float* row = p + r * ld;
    const int64_t len = std::min(ld, first_len + r / rows_per_query);
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < len; ++j) mx = std::max(mx, row[j]);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < len; ++j) {
      const float e = std::exp(row[j] - mx);
      row[j] = e;
      sum += e;
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int64_t j = 0; j < len; ++j) row[j] *= inv;
    for (int64_t j = len; j < ld; ++j) row[j] = 0.0f;
  }
}

// One head of causal attention through GEMMs: score = scale * (q1 . k1 + q2 . k2) (the second
// part optional: dk2 = 0), out = softmax(score) @ v. Query i of T sits at position S - T + i.
struct HeadArgs {
  const float* q1;
  int64_t ldq1;
  const float* k1;
  int64_t ldk1;
  int64_t dk1;
  const float* q2;
  int64_t ldq2;
  const float* k2;
  int64_t ldk2;
  int64_t dk2;
  const float* v;
  int64_t ldv;
  int64_t dv;
  float* o;
  int64_t ldo;
};

void attend_head(const HeadArgs& a, int64_t t_total, int64_t s, float scale,
                 std::vector<float>& scratch) {
  const int64_t tc_max = std::clamp<int64_t>(kScoreBudget / std::max<int64_t>(s, 1), 1, t_total);
  scratch.resize(static_cast<size_t>(tc_max * s));
  float* p = scratch.data();
  for (int64_t t0 = 0; t0 < t_total; t0 += tc_max) {
    const int64_t tc = std::min(tc_max, t_total - t0);
    const int64_t first_len = s - t_total + t0 + 1;  // keys visible to the chunk's first query
    const int64_t len = first_len + tc - 1;          // ... and to its last one
    sgemm(false, true, tc, len, a.dk1, scale, a.q1 + t0 * a.ldq1, a.ldq1, a.k1, a.ldk1, 0.0f, p,
          len);
    if (a.dk2 > 0) {
      sgemm(false, true, tc, len, a.dk2, scale, a.q2 + t0 * a.ldq2, a.ldq2, a.k2, a.ldk2, 1.0f, p,
            len);
    }
    causal_softmax_rows(p, tc, len, first_len, 1);
    sgemm(false, false, tc, a.dv, len, 1.0f, p, len, a.v, a.ldv, 0.0f, a.o + t0 * a.ldo, a.ldo);
  }
}

struct MlaShapes {
  int64_t t, s, h, dn, dr, dv, r;
};

MlaShapes check_mla(const char* fn, const Tensor& q, const Tensor& cache_latent,
                    const Tensor& cache_rope, const Tensor& kv_b, const MlaDims& dims,
                    const Tensor& out) {
  LOOM_CHECK_F32(q);
  LOOM_CHECK_F32(cache_latent);
  LOOM_CHECK_F32(cache_rope);
  LOOM_CHECK_F32(kv_b);
  LOOM_CHECK_F32(out);
  MlaShapes m{q.ndim() == 3 ? q.dim(0) : -1,
              cache_latent.ndim() == 2 ? cache_latent.dim(0) : -1,
              dims.heads,
              dims.nope_dim,
              dims.rope_dim,
              dims.v_dim,
              dims.latent_dim};
  LOOM_CHECK(m.h > 0 && m.dn > 0 && m.dr >= 0 && m.dv > 0 && m.r > 0,
             "%s: bad dims H=%d dn=%d dr=%d dv=%d R=%d", fn, m.h, m.dn, m.dr, m.dv, m.r);
  LOOM_CHECK(m.t >= 0 && m.s >= m.t, "%s: q %s cache_latent %s (need S >= T)", fn,
             q.describe().c_str(), cache_latent.describe().c_str());
  LOOM_CHECK_SHAPE(q, m.t, m.h, m.dn + m.dr);
  LOOM_CHECK_SHAPE(cache_latent, m.s, m.r);
  LOOM_CHECK_SHAPE(cache_rope, m.s, m.dr);
  LOOM_CHECK_SHAPE(kv_b, m.h * (m.dn + m.dv), m.r);
  LOOM_CHECK_SHAPE(out, m.t, m.h, m.dv);
  return m;
}

}  // namespace

void mla_attention_expanded(const Tensor& q, const Tensor& cache_latent, const Tensor& cache_rope,
                            const Tensor& kv_b, const MlaDims& dims, float scale,
                            const Tensor& out) {
  const MlaShapes m =
      check_mla("mla_attention_expanded", q, cache_latent, cache_rope, kv_b, dims, out);
  if (m.t == 0) return;
  const float* qp = q.data<float>();
  const float* c = cache_latent.data<float>();
  const float* kr = cache_rope.data<float>();
  const float* wb = kv_b.data<float>();
  float* op = out.data<float>();
  const int64_t dkv = m.dn + m.dv;
  // Expanded per head ([S, dn + dv] = c @ kv_b_h^T), so the buffer is S * (dn + dv), not
  // S * H * (dn + dv); the FLOPs are the same as one [S, R] x [R, H * (dn + dv)] product.
  std::vector<float> kv(static_cast<size_t>(m.s * dkv));
  std::vector<float> scratch;
  for (int64_t h = 0; h < m.h; ++h) {
    sgemm(false, true, m.s, dkv, m.r, 1.0f, c, m.r, wb + h * dkv * m.r, m.r, 0.0f, kv.data(), dkv);
    HeadArgs a{qp + h * (m.dn + m.dr),
               m.h * (m.dn + m.dr),
               kv.data(),
               dkv,
               m.dn,
               qp + h * (m.dn + m.dr) + m.dn,
               m.h * (m.dn + m.dr),
               kr,
               m.dr,
               m.dr,
               kv.data() + m.dn,
               dkv,
               m.dv,
               op + h * m.dv,
               m.h * m.dv};
    attend_head(a, m.t, m.s, scale, scratch);
  }
}

void mla_attention_absorbed(const Tensor& q, const Tensor& cache_latent, const Tensor& cache_rope,
                            const Tensor& kv_b, const MlaDims& dims, float scale,
                            const Tensor& out) {
  const MlaShapes m =
      check_mla("mla_attention_absorbed", q, cache_latent, cache_rope, kv_b, dims, out);
  if (m.t == 0) return;
  const float* qp = q.data<float>();
  const float* c = cache_latent.data<float>();
  const float* kr = cache_rope.data<float>();
  const float* wb = kv_b.data<float>();
  float* op = out.data<float>();
  const int64_t dkv = m.dn + m.dv;
  const int64_t dq = m.dn + m.dr;
  // Rows are (t, h) pairs, row t * H + h: every head of every query scores against the same
  // latent cache, so one GEMM covers them all and the cache is read twice per chunk (scores and
  // p @ c), not twice per head.
  const int64_t tc_max =
      std::clamp<int64_t>(kScoreBudget / std::max<int64_t>(m.s * m.h, 1), 1, m.t);
  std::vector<float> qabs(static_cast<size_t>(tc_max * m.h * m.r));
  std::vector<float> olat(static_cast<size_t>(tc_max * m.h * m.r));
  std::vector<float> p(static_cast<size_t>(tc_max * m.h * m.s));
  for (int64_t t0 = 0; t0 < m.t; t0 += tc_max) {
    const int64_t tc = std::min(tc_max, m.t - t0);
    const int64_t rows = tc * m.h;
    const int64_t first_len = m.s - m.t + t0 + 1;
    const int64_t len = first_len + tc - 1;
    const float* q0 = qp + t0 * m.h * dq;
    // q_abs[t, h, :] = q_nope[t, h, :] @ W_UK_h, W_UK_h = kv_b rows [h*dkv, h*dkv + dn) ([dn, R]).
    for (int64_t h = 0; h < m.h; ++h) {
      sgemm(false, false, tc, m.r, m.dn, 1.0f, q0 + h * dq, m.h * dq, wb + h * dkv * m.r, m.r, 0.0f,
            qabs.data() + h * m.r, m.h * m.r);
    }
    sgemm(false, true, rows, len, m.r, scale, qabs.data(), m.r, c, m.r, 0.0f, p.data(), len);
    if (m.dr > 0) {
      sgemm(false, true, rows, len, m.dr, scale, q0 + m.dn, dq, kr, m.dr, 1.0f, p.data(), len);
    }
    causal_softmax_rows(p.data(), rows, len, first_len, m.h);
    sgemm(false, false, rows, m.r, len, 1.0f, p.data(), len, c, m.r, 0.0f, olat.data(), m.r);
    // out[t, h, :] = o_lat[t, h, :] @ W_UV_h^T, W_UV_h = kv_b rows [h*dkv + dn, (h+1)*dkv).
    for (int64_t h = 0; h < m.h; ++h) {
      sgemm(false, true, tc, m.dv, m.r, 1.0f, olat.data() + h * m.r, m.h * m.r,
            wb + (h * dkv + m.dn) * m.r, m.r, 0.0f, op + (t0 * m.h + h) * m.dv, m.h * m.dv);
    }
  }
}

void gqa_attention_forward(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                           float scale, const Tensor& out) {
  LOOM_CHECK_F32(q);
  LOOM_CHECK_F32(k_cache);
  LOOM_CHECK_F32(v_cache);
  LOOM_CHECK_F32(out);
  LOOM_CHECK(q.ndim() == 3 && k_cache.ndim() == 3 && v_cache.ndim() == 3,
             "gqa_attention_forward: q %s k %s v %s", q.describe().c_str(),
             k_cache.describe().c_str(), v_cache.describe().c_str());
  const int64_t t = q.dim(0), hq = q.dim(1), d = q.dim(2);
  const int64_t s = k_cache.dim(0), hkv = k_cache.dim(1), dv = v_cache.dim(2);
  LOOM_CHECK(hkv > 0 && hq % hkv == 0 && s >= t && d > 0 && dv > 0,
             "gqa_attention_forward: q %s k %s v %s (need Hq %% Hkv == 0, S >= T)",
             q.describe().c_str(), k_cache.describe().c_str(), v_cache.describe().c_str());
  LOOM_CHECK_SHAPE(k_cache, s, hkv, d);
  LOOM_CHECK_SHAPE(v_cache, s, hkv, dv);
  LOOM_CHECK_SHAPE(out, t, hq, dv);
  if (t == 0) return;
  const int64_t rep = hq / hkv;
  const float* qp = q.data<float>();
  const float* kp = k_cache.data<float>();
  const float* vp = v_cache.data<float>();
  float* op = out.data<float>();
  std::vector<float> scratch;
  for (int64_t h = 0; h < hq; ++h) {
    const int64_t g = h / rep;
    HeadArgs a{qp + h * d, hq * d, kp + g * d,  hkv * d,  d,  nullptr,     0,      nullptr,
               0,          0,      vp + g * dv, hkv * dv, dv, op + h * dv, hq * dv};
    attend_head(a, t, s, scale, scratch);
  }
}

}  // namespace loom::cpu
