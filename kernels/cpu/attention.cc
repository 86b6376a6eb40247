// Softmax attention on the CPU. All products go through OpenBLAS sgemm (which threads itself);
// the row softmax is an OpenMP loop. Scores are materialised per chunk of queries so their
// buffer stays bounded (kScoreBudget floats) whatever the sequence length.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/kv_fp8.h"
#include "kernels/cpu/varlen.h"

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

// A page's run of bf16 cache rows widened to f32 for sgemm (exact: bf16 is the top half of an
// f32). One buffer a thread, reused: blocks() hands it to its callback, which is done with it
// before the next run is widened.
const float* widen_bf16_rows(const uint16_t* rows, int64_t elems) {
  thread_local std::vector<float> buf;
  buf.resize(static_cast<size_t>(elems));
  for (int64_t i = 0; i < elems; ++i) buf[i] = bf16_to_f32(rows[i]);
  return buf.data();
}

// A page's run of fp8 cache rows dequantized to f32 (kernels/attention.h's format), the scales
// dropped: `rows` rows of row_values() floats. The same per-thread buffer discipline as above.
const float* dequantize_fp8_rows(const CacheView& v, const uint8_t* rows, int64_t n) {
  thread_local std::vector<float> buf;
  const int64_t dim = kv_pool_vector_dim(v.pool);
  const int64_t vectors = v.row_elems() / v.pool.dim(v.pool.ndim() - 1);
  buf.resize(static_cast<size_t>(n * vectors * dim));
  kv_fp8_dequantize_rows(rows, n, vectors, dim, buf.data());
  return buf.data();
}

// Rows of keys or values: dense (row j at dense + j * ld) or a paged cache view (row j at
// view->row(j) + col; bf16 and fp8 pages are widened a page at a time, so col and the stride
// count values, not a pool's fp8 bytes). blocks() yields maximal runs
// [j0, j1) that are contiguous in memory, so every product below is one GEMM per page (one GEMM
// in all for a dense or contiguous cache).
struct Rows {
  const float* dense = nullptr;
  int64_t ld = 0;
  const CacheView* view = nullptr;
  int64_t col = 0;

  static Rows of_dense(const float* p, int64_t ld) { return Rows{p, ld, nullptr, 0}; }
  static Rows of_view(const CacheView& v, int64_t col) { return Rows{nullptr, 0, &v, col}; }
  int64_t stride() const { return view ? view->row_values() : ld; }
  template <typename F>
  void blocks(int64_t len, F&& f) const {
    if (view == nullptr) {
      if (len > 0) f(int64_t{0}, len, dense);
      return;
    }
    const int64_t ps = view->page_size();
    for (int64_t j0 = 0; j0 < len;) {
      const int64_t j1 = std::min(len, (j0 / ps + 1) * ps);
      if (view->pool.dtype() == DType::kBF16) {
        f(j0, j1, widen_bf16_rows(view->row<uint16_t>(j0), (j1 - j0) * stride()) + col);
      } else if (view->pool.dtype() == DType::kF8E4M3) {
        f(j0, j1, dequantize_fp8_rows(*view, view->row<uint8_t>(j0), j1 - j0) + col);
      } else {
        f(j0, j1, view->row(j0) + col);
      }
      j0 = j1;
    }
  }
};

// p[:, 0:len] (row stride len) = alpha * a @ k[0:len]^T + beta * p. a: [m, dk] with stride lda.
void scores(int64_t m, int64_t len, int64_t dk, float alpha, const float* a, int64_t lda,
            const Rows& k, float beta, float* p) {
  k.blocks(len, [&](int64_t j0, int64_t j1, const float* kp) {
    sgemm(false, true, m, j1 - j0, dk, alpha, a, lda, kp, k.stride(), beta, p + j0, len);
  });
}

// o = p[:, 0:len] @ v[0:len] (o overwritten). p: [m, len]; o: [m, dv] with stride ldo.
void weighted_sum(int64_t m, int64_t len, int64_t dv, const float* p, const Rows& v, float* o,
                  int64_t ldo) {
  bool first = true;
  v.blocks(len, [&](int64_t j0, int64_t j1, const float* vp) {
    sgemm(false, false, m, dv, j1 - j0, 1.0f, p + j0, len, vp, v.stride(), first ? 0.0f : 1.0f, o,
          ldo);
    first = false;
  });
}

// One head of causal attention through GEMMs: score = scale * (q1 . k1 + q2 . k2) (the second
// part optional: dk2 = 0), out = softmax(score) @ v. Query i of T sits at position S - T + i.
struct HeadArgs {
  const float* q1;
  int64_t ldq1;
  Rows k1;
  int64_t dk1;
  const float* q2;
  int64_t ldq2;
  Rows k2;
  int64_t dk2;
  Rows v;
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
    scores(tc, len, a.dk1, scale, a.q1 + t0 * a.ldq1, a.ldq1, a.k1, 0.0f, p);
    if (a.dk2 > 0) scores(tc, len, a.dk2, scale, a.q2 + t0 * a.ldq2, a.ldq2, a.k2, 1.0f, p);
    causal_softmax_rows(p, tc, len, first_len, 1);
    weighted_sum(tc, len, a.dv, p, a.v, a.o + t0 * a.ldo, a.ldo);
  }
}

struct MlaShapes {
  int64_t t, s, h, dn, dr, dv, r;
};

// The pools the CPU kernels read and write: contiguous host f32, bf16 or fp8 (Rows::blocks widens
// bf16 and dequantizes fp8; an fp8 pool's last dimension holds the scale's 4 bytes).
void check_host_pool(const char* fn, const char* what, const Tensor& pool) {
  const bool fp8 = pool.dtype() == DType::kF8E4M3;
  LOOM_CHECK((pool.dtype() == DType::kF32 || pool.dtype() == DType::kBF16 || fp8) &&
                 pool.device().is_cpu() && pool.is_contiguous() &&
                 (!fp8 || (pool.ndim() >= 3 && pool.dim(pool.ndim() - 1) > kKvFp8ScaleBytes)),
             "%s: %s pool %s, expected a contiguous f32, bf16 or fp8 host pool (fp8: vectors of "
             "n values + a 4-byte scale)",
             fn, what, pool.describe().c_str());
}

void check_view(const char* fn, const char* what, const CacheView& v, int64_t row_elems) {
  check_host_pool(fn, what, v.pool);
  LOOM_CHECK(v.pool.ndim() >= 2 && v.pages.dtype() == DType::kI32 && v.pages.ndim() == 1 &&
                 v.length >= 0 && v.row_values() == row_elems,
             "%s: %s view of %s (length %lld) needs rows of %lld values", fn, what,
             v.pool.describe().c_str(), static_cast<long long>(v.length),
             static_cast<long long>(row_elems));
  const int64_t used_pages = (v.length + v.page_size() - 1) / v.page_size();
  LOOM_CHECK(v.pages.dim(0) >= used_pages, "%s: %s page table of %lld for %lld positions", fn, what,
             static_cast<long long>(v.pages.dim(0)), static_cast<long long>(v.length));
  for (int64_t i = 0; i < used_pages; ++i)
    LOOM_CHECK(v.page_ids()[i] >= 0 && v.page_ids()[i] < v.pool.dim(0),
               "%s: %s page %d outside [0, %lld)", fn, what, v.page_ids()[i],
               static_cast<long long>(v.pool.dim(0)));
}

MlaShapes check_mla(const char* fn, const Tensor& q, const CacheView& cache_latent,
                    const CacheView& cache_rope, const Tensor& kv_b, const MlaDims& dims,
                    const Tensor& out) {
  LOOM_CHECK_F32(q);
  LOOM_CHECK_F32(kv_b);
  LOOM_CHECK_F32(out);
  MlaShapes m{q.ndim() == 3 ? q.dim(0) : -1,
              cache_latent.length,
              dims.heads,
              dims.nope_dim,
              dims.rope_dim,
              dims.v_dim,
              dims.latent_dim};
  LOOM_CHECK(m.h > 0 && m.dn > 0 && m.dr >= 0 && m.dv > 0 && m.r > 0,
             "%s: bad dims H=%d dn=%d dr=%d dv=%d R=%d", fn, m.h, m.dn, m.dr, m.dv, m.r);
  LOOM_CHECK(m.t >= 0 && m.s >= m.t && cache_rope.length == m.s,
             "%s: q %s, latent length %lld, rope length %lld (need S >= T)", fn,
             q.describe().c_str(), static_cast<long long>(m.s),
             static_cast<long long>(cache_rope.length));
  check_view(fn, "latent", cache_latent, m.r);
  if (m.dr > 0) check_view(fn, "rope", cache_rope, m.dr);
  LOOM_CHECK_SHAPE(q, m.t, m.h, m.dn + m.dr);
  LOOM_CHECK_SHAPE(kv_b, m.h * (m.dn + m.dv), m.r);
  LOOM_CHECK_SHAPE(out, m.t, m.h, m.dv);
  return m;
}

}  // namespace

void cache_write_rows(const CacheView& view, int64_t start, const Tensor& rows) {
  LOOM_CHECK_F32(rows);
  check_host_pool("cache_write_rows", "the", view.pool);
  const int64_t n = rows.ndim() >= 1 ? rows.dim(0) : 0;
  const int64_t w = view.row_values();
  LOOM_CHECK(n == 0 || rows.numel() / n == w, "cache_write_rows: rows %s into rows of %lld",
             rows.describe().c_str(), static_cast<long long>(w));
  LOOM_CHECK(n == 0 || (start + n - 1) / view.page_size() < view.pages.dim(0),
             "cache_write_rows: positions [%lld, %lld) beyond a page table of %lld",
             static_cast<long long>(start), static_cast<long long>(start + n),
             static_cast<long long>(view.pages.dim(0)));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t j = start + i;
    LOOM_CHECK(view.page_ids()[j / view.page_size()] >= 0 &&
                   view.page_ids()[j / view.page_size()] < view.pool.dim(0),
               "cache_write_rows: position %lld maps to page %d of %lld", static_cast<long long>(j),
               view.page_ids()[j / view.page_size()], static_cast<long long>(view.pool.dim(0)));
    const float* src = rows.data<float>() + i * w;
    if (view.pool.dtype() == DType::kBF16) {
      uint16_t* dst = view.row<uint16_t>(j);
      for (int64_t e = 0; e < w; ++e) dst[e] = f32_to_bf16(src[e]);
    } else if (view.pool.dtype() == DType::kF8E4M3) {
      // Each vector of the row (the row itself for MLA, one kv head for GQA) with its scale.
      const int64_t dim = kv_pool_vector_dim(view.pool);
      uint8_t* dst = view.row<uint8_t>(j);
      for (int64_t e = 0; e < w / dim; ++e)
        kv_fp8_quantize(src + e * dim, dim, dst + e * (dim + kKvFp8ScaleBytes));
    } else {
      std::memcpy(view.row(j), src, w * sizeof(float));
    }
  }
}

void mla_attention_expanded(const Tensor& q, const CacheView& cache_latent,
                            const CacheView& cache_rope, const Tensor& kv_b, const MlaDims& dims,
                            float scale, const Tensor& out) {
  const MlaShapes m =
      check_mla("mla_attention_expanded", q, cache_latent, cache_rope, kv_b, dims, out);
  if (m.t == 0) return;
  const float* qp = q.data<float>();
  const float* wb = kv_b.data<float>();
  float* op = out.data<float>();
  const int64_t dkv = m.dn + m.dv;
  const Rows latent = Rows::of_view(cache_latent, 0);
  // Expanded per head ([S, dn + dv] = c @ kv_b_h^T, one GEMM per page), so the buffer is
  // S * (dn + dv), not S * H * (dn + dv); the FLOPs are those of one [S, R] x [R, H * (dn + dv)].
  std::vector<float> kv(static_cast<size_t>(m.s * dkv));
  std::vector<float> scratch;
  for (int64_t h = 0; h < m.h; ++h) {
    latent.blocks(m.s, [&](int64_t j0, int64_t j1, const float* c) {
      sgemm(false, true, j1 - j0, dkv, m.r, 1.0f, c, latent.stride(), wb + h * dkv * m.r, m.r, 0.0f,
            kv.data() + j0 * dkv, dkv);
    });
    HeadArgs a{qp + h * (m.dn + m.dr),
               m.h * (m.dn + m.dr),
               Rows::of_dense(kv.data(), dkv),
               m.dn,
               qp + h * (m.dn + m.dr) + m.dn,
               m.h * (m.dn + m.dr),
               m.dr > 0 ? Rows::of_view(cache_rope, 0) : Rows{},
               m.dr,
               Rows::of_dense(kv.data() + m.dn, dkv),
               m.dv,
               op + h * m.dv,
               m.h * m.dv};
    attend_head(a, m.t, m.s, scale, scratch);
  }
}

void mla_attention_absorbed(const Tensor& q, const CacheView& cache_latent,
                            const CacheView& cache_rope, const Tensor& kv_b, const MlaDims& dims,
                            float scale, const Tensor& out) {
  const MlaShapes m =
      check_mla("mla_attention_absorbed", q, cache_latent, cache_rope, kv_b, dims, out);
  if (m.t == 0) return;
  const float* qp = q.data<float>();
  const float* wb = kv_b.data<float>();
  float* op = out.data<float>();
  const int64_t dkv = m.dn + m.dv;
  const int64_t dq = m.dn + m.dr;
  const Rows latent = Rows::of_view(cache_latent, 0);
  // Rows are (t, h) pairs, row t * H + h: every head of every query scores against the same
  // latent cache, so one GEMM per page covers them all and the cache is read twice per chunk
  // (scores and p @ c), not twice per head.
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
    scores(rows, len, m.r, scale, qabs.data(), m.r, latent, 0.0f, p.data());
    if (m.dr > 0)
      scores(rows, len, m.dr, scale, q0 + m.dn, dq, Rows::of_view(cache_rope, 0), 1.0f, p.data());
    causal_softmax_rows(p.data(), rows, len, first_len, m.h);
    weighted_sum(rows, len, m.r, p.data(), latent, olat.data(), m.r);
    // out[t, h, :] = o_lat[t, h, :] @ W_UV_h^T, W_UV_h = kv_b rows [h*dkv + dn, (h+1)*dkv).
    for (int64_t h = 0; h < m.h; ++h) {
      sgemm(false, true, tc, m.dv, m.r, 1.0f, olat.data() + h * m.r, m.h * m.r,
            wb + (h * dkv + m.dn) * m.r, m.r, 0.0f, op + (t0 * m.h + h) * m.dv, m.h * m.dv);
    }
  }
}

void gqa_attention_forward(const Tensor& q, const CacheView& k_cache, const CacheView& v_cache,
                           float scale, const Tensor& out) {
  LOOM_CHECK_F32(q);
  LOOM_CHECK_F32(out);
  LOOM_CHECK(q.ndim() == 3 && k_cache.pool.ndim() == 4 && v_cache.pool.ndim() == 4,
             "gqa_attention_forward: q %s k pool %s v pool %s", q.describe().c_str(),
             k_cache.pool.describe().c_str(), v_cache.pool.describe().c_str());
  const int64_t t = q.dim(0), hq = q.dim(1), d = q.dim(2);
  // kv_pool_vector_dim: an fp8 pool's last dimension also holds each vector's scale.
  const int64_t s = k_cache.length, hkv = k_cache.pool.dim(2),
                dv = kv_pool_vector_dim(v_cache.pool);
  LOOM_CHECK(hkv > 0 && hq % hkv == 0 && s >= t && v_cache.length == s && d > 0 && dv > 0 &&
                 v_cache.pool.dim(2) == hkv && kv_pool_vector_dim(k_cache.pool) == d,
             "gqa_attention_forward: q %s k pool %s v pool %s, S = %lld (need Hq %% Hkv == 0, "
             "S >= T)",
             q.describe().c_str(), k_cache.pool.describe().c_str(), v_cache.pool.describe().c_str(),
             static_cast<long long>(s));
  check_view("gqa_attention_forward", "key", k_cache, hkv * d);
  check_view("gqa_attention_forward", "value", v_cache, hkv * dv);
  LOOM_CHECK_SHAPE(out, t, hq, dv);
  if (t == 0) return;
  const int64_t rep = hq / hkv;
  const float* qp = q.data<float>();
  float* op = out.data<float>();
  std::vector<float> scratch;
  for (int64_t h = 0; h < hq; ++h) {
    const int64_t g = h / rep;
    HeadArgs a{qp + h * d, hq * d, Rows::of_view(k_cache, g * d),  d,  nullptr,     0,
               Rows{},     0,      Rows::of_view(v_cache, g * dv), dv, op + h * dv, hq * dv};
    attend_head(a, t, s, scale, scratch);
  }
}

namespace {

// The per-sequence views of a varlen call: checks its step data and returns B.
struct VarlenViews {
  const Tensor& page_table;
  const int64_t* cu;
  const int64_t* past;

  CacheView view(const Tensor& pool, int64_t b) const {
    CacheView v;
    v.pool = pool;
    v.pages = page_table.select(b);
    v.length = past[b] + cu[b + 1] - cu[b];
    return v;
  }
};

VarlenViews check_varlen(const char* op, const Tensor& page_table, const Tensor& cu_seqlens,
                         const Tensor& past_lens, int64_t rows) {
  const int64_t b = check_cu_seqlens(op, cu_seqlens, rows);
  LOOM_CHECK(page_table.dtype() == DType::kI32 && page_table.ndim() == 2 &&
                 page_table.dim(0) == b && page_table.is_contiguous(),
             "%s: page_table %s for %lld sequences", op, page_table.describe().c_str(),
             static_cast<long long>(b));
  check_past_lens(op, past_lens, b);
  return VarlenViews{page_table, cu_seqlens.data<int64_t>(), past_lens.data<int64_t>()};
}

}  // namespace

void cache_write_varlen(const Tensor& pool, const Tensor& page_table, const Tensor& cu_seqlens,
                        const Tensor& past_lens, const Tensor& rows) {
  LOOM_CHECK(rows.ndim() >= 1, "cache_write_varlen: rows %s", rows.describe().c_str());
  const VarlenViews seq =
      check_varlen("cache_write_varlen", page_table, cu_seqlens, past_lens, rows.dim(0));
  for (int64_t b = 0; b + 1 < cu_seqlens.dim(0); ++b)
    cache_write_rows(seq.view(pool, b), seq.past[b], rows.slice(0, seq.cu[b], seq.cu[b + 1]));
}

void mla_attention_varlen(const Tensor& q, const Tensor& latent_pool, const Tensor& rope_pool,
                          const Tensor& page_table, const Tensor& cu_seqlens,
                          const Tensor& past_lens, const Tensor& kv_b, const MlaDims& dims,
                          float scale, bool batch_invariant, const Tensor& out) {
  LOOM_CHECK(q.ndim() == 3 && out.ndim() == 3 && out.dim(0) == q.dim(0),
             "mla_attention_varlen: q %s out %s", q.describe().c_str(), out.describe().c_str());
  const VarlenViews seq =
      check_varlen("mla_attention_varlen", page_table, cu_seqlens, past_lens, q.dim(0));
  for (int64_t b = 0; b + 1 < cu_seqlens.dim(0); ++b) {
    const CacheView latent = seq.view(latent_pool, b), rope = seq.view(rope_pool, b);
    const int64_t r0 = seq.cu[b], r1 = seq.cu[b + 1];
    const auto attend =
        mla_attention_form(r1 - r0, latent.length, dims, batch_invariant) == MlaForm::kAbsorbed
            ? mla_attention_absorbed
            : mla_attention_expanded;
    attend(q.slice(0, r0, r1), latent, rope, kv_b, dims, scale, out.slice(0, r0, r1));
  }
}

void gqa_attention_varlen(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool,
                          const Tensor& page_table, const Tensor& cu_seqlens,
                          const Tensor& past_lens, float scale, const Tensor& out) {
  LOOM_CHECK(q.ndim() == 3 && out.ndim() == 3 && out.dim(0) == q.dim(0),
             "gqa_attention_varlen: q %s out %s", q.describe().c_str(), out.describe().c_str());
  const VarlenViews seq =
      check_varlen("gqa_attention_varlen", page_table, cu_seqlens, past_lens, q.dim(0));
  for (int64_t b = 0; b + 1 < cu_seqlens.dim(0); ++b) {
    const int64_t r0 = seq.cu[b], r1 = seq.cu[b + 1];
    gqa_attention_forward(q.slice(0, r0, r1), seq.view(k_pool, b), seq.view(v_pool, b), scale,
                          out.slice(0, r0, r1));
  }
}

}  // namespace loom::cpu
