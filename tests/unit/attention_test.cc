// MLA (expanded and absorbed) and GQA attention against naive double-precision references, and the
// varlen forms against the per-sequence ops they run.
#include "kernels/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

namespace loom {
namespace {

Tensor random_tensor(Shape shape, std::mt19937& rng, float lo, float hi) {
  Tensor t = Tensor::empty(shape);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

// Naive MLA in double: expand k_nope / v per head and position, causal softmax, weighted sum.
std::vector<double> naive_mla(const Tensor& q, const Tensor& c, const Tensor& kr,
                              const Tensor& kv_b, const MlaDims& m, double scale) {
  const int64_t t = q.dim(0), s = c.dim(0), h = m.heads, dn = m.nope_dim, dr = m.rope_dim,
                dv = m.v_dim, r = m.latent_dim;
  std::vector<double> out(t * h * dv, 0.0);
  std::vector<double> kn(s * dn), v(s * dv), sc(s);
  for (int64_t hh = 0; hh < h; ++hh) {
    for (int64_t j = 0; j < s; ++j) {
      for (int64_t a = 0; a < dn + dv; ++a) {
        double acc = 0.0;
        for (int64_t l = 0; l < r; ++l) {
          acc += double(kv_b.at<float>({hh * (dn + dv) + a, l})) * c.at<float>({j, l});
        }
        if (a < dn)
          kn[j * dn + a] = acc;
        else
          v[j * dv + a - dn] = acc;
      }
    }
    for (int64_t i = 0; i < t; ++i) {
      const int64_t len = s - t + i + 1;
      double mx = -1e300;
      for (int64_t j = 0; j < len; ++j) {
        double acc = 0.0;
        for (int64_t a = 0; a < dn; ++a) acc += double(q.at<float>({i, hh, a})) * kn[j * dn + a];
        for (int64_t a = 0; a < dr; ++a) {
          acc += double(q.at<float>({i, hh, dn + a})) * kr.at<float>({j, a});
        }
        sc[j] = acc * scale;
        mx = std::max(mx, sc[j]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j < len; ++j) sum += (sc[j] = std::exp(sc[j] - mx));
      for (int64_t j = 0; j < len; ++j) {
        for (int64_t a = 0; a < dv; ++a) out[(i * h + hh) * dv + a] += sc[j] / sum * v[j * dv + a];
      }
    }
  }
  return out;
}

double max_abs_diff(const Tensor& a, const std::vector<double>& b) {
  double m = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::abs(a.data<float>()[i] - b[i]));
  return m;
}
double max_abs_diff(const Tensor& a, const Tensor& b) {
  double m = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    m = std::max(m, double(std::abs(a.data<float>()[i] - b.data<float>()[i])));
  }
  return m;
}

// Inputs are scaled so k_nope, v, scores are O(1) (kv_b ~ U(-1,1)/sqrt(R), scores have spread
// of a few units so the softmax is far from uniform). Outputs are convex combinations of O(1)
// values; f32 error is dot products of length <= R = 72 and S = 200 terms: ~1e-6 typical,
// measured <= 4e-7, so 3e-6 absolute has a ~10x margin while catching any indexing/masking bug
// (errors ~1e-1).
constexpr double kTol = 3e-6;

struct MlaCase {
  int64_t t, s;
};

class MlaTest : public ::testing::TestWithParam<MlaCase> {};

TEST_P(MlaTest, ExpandedAbsorbedNaiveAgree) {
  const MlaCase p = GetParam();
  const MlaDims m{5, 24, 10, 20, 72};  // H, dn, dr, dv, R: nothing a multiple of 8 or 16
  std::mt19937 rng(static_cast<unsigned>(1000 + p.t * 7 + p.s));
  Tensor q = random_tensor({p.t, m.heads, m.nope_dim + m.rope_dim}, rng, -1.5f, 1.5f);
  Tensor c = random_tensor({p.s, m.latent_dim}, rng, -1.0f, 1.0f);
  Tensor kr = random_tensor({p.s, m.rope_dim}, rng, -1.0f, 1.0f);
  const float wscale = 1.7f / std::sqrt(float(m.latent_dim));
  Tensor kv_b =
      random_tensor({m.heads * (m.nope_dim + m.v_dim), m.latent_dim}, rng, -wscale, wscale);
  const float scale = 1.0f / std::sqrt(float(m.nope_dim + m.rope_dim)) * 2.0f;
  Tensor oe = Tensor::empty({p.t, m.heads, m.v_dim}), oa = Tensor::empty({p.t, m.heads, m.v_dim});
  mla_attention_expanded(host_exec(), q, CacheView::contiguous(c), CacheView::contiguous(kr), kv_b,
                         m, scale, oe);
  mla_attention_absorbed(host_exec(), q, CacheView::contiguous(c), CacheView::contiguous(kr), kv_b,
                         m, scale, oa);
  const auto ref = naive_mla(q, c, kr, kv_b, m, scale);
  const double e_exp = max_abs_diff(oe, ref), e_abs = max_abs_diff(oa, ref),
               e_ea = max_abs_diff(oe, oa);
  std::printf("MLA T=%lld S=%lld: |expanded-naive| %.3g |absorbed-naive| %.3g |exp-abs| %.3g\n",
              (long long)p.t, (long long)p.s, e_exp, e_abs, e_ea);
  EXPECT_LT(e_exp, kTol);
  EXPECT_LT(e_abs, kTol);
  EXPECT_LT(e_ea, kTol);
}

INSTANTIATE_TEST_SUITE_P(Shapes, MlaTest,
                         ::testing::Values(MlaCase{1, 200},   // decode
                                           MlaCase{37, 200},  // chunk with offset 163
                                           MlaCase{37, 37},   // prefill from empty
                                           MlaCase{1, 1}));   // first token

TEST(Mla, NoRopePart) {  // kimi_linear style dr may still exist; check dr = 0 is handled
  const MlaDims m{3, 16, 0, 12, 40};
  std::mt19937 rng(4);
  Tensor q = random_tensor({9, 3, 16}, rng, -1, 1), c = random_tensor({30, 40}, rng, -1, 1);
  Tensor kr = Tensor::empty({30, 0});
  Tensor kv_b = random_tensor({3 * 28, 40}, rng, -0.3f, 0.3f);
  Tensor oe = Tensor::empty({9, 3, 12}), oa = Tensor::empty({9, 3, 12});
  mla_attention_expanded(host_exec(), q, CacheView::contiguous(c), CacheView::contiguous(kr), kv_b,
                         m, 0.25f, oe);
  mla_attention_absorbed(host_exec(), q, CacheView::contiguous(c), CacheView::contiguous(kr), kv_b,
                         m, 0.25f, oa);
  const auto ref = naive_mla(q, c, kr, kv_b, m, 0.25);
  EXPECT_LT(max_abs_diff(oe, ref), kTol);
  EXPECT_LT(max_abs_diff(oa, ref), kTol);
}

std::vector<double> naive_gqa(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  const int64_t t = q.dim(0), hq = q.dim(1), d = q.dim(2), s = k.dim(0), hkv = k.dim(1),
                dv = v.dim(2);
  std::vector<double> out(t * hq * dv, 0.0), sc(s);
  for (int64_t h = 0; h < hq; ++h) {
    const int64_t g = h / (hq / hkv);
    for (int64_t i = 0; i < t; ++i) {
      const int64_t len = s - t + i + 1;
      double mx = -1e300;
      for (int64_t j = 0; j < len; ++j) {
        double acc = 0.0;
        for (int64_t a = 0; a < d; ++a)
          acc += double(q.at<float>({i, h, a})) * k.at<float>({j, g, a});
        sc[j] = acc * scale;
        mx = std::max(mx, sc[j]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j < len; ++j) sum += (sc[j] = std::exp(sc[j] - mx));
      for (int64_t j = 0; j < len; ++j) {
        for (int64_t a = 0; a < dv; ++a)
          out[(i * hq + h) * dv + a] += sc[j] / sum * v.at<float>({j, g, a});
      }
    }
  }
  return out;
}

struct GqaCase {
  int64_t t, s, hq, hkv, d, dv;
};
class GqaTest : public ::testing::TestWithParam<GqaCase> {};

TEST_P(GqaTest, MatchesNaive) {
  const GqaCase p = GetParam();
  std::mt19937 rng(static_cast<unsigned>(77 + p.t + p.s + p.hq));
  Tensor q = random_tensor({p.t, p.hq, p.d}, rng, -1, 1);
  Tensor k = random_tensor({p.s, p.hkv, p.d}, rng, -1, 1);
  Tensor v = random_tensor({p.s, p.hkv, p.dv}, rng, -1, 1);
  Tensor out = Tensor::empty({p.t, p.hq, p.dv});
  const float scale = 2.0f / std::sqrt(float(p.d));
  gqa_attention_forward(host_exec(), q, CacheView::contiguous(k), CacheView::contiguous(v), scale,
                        out);
  const double err = max_abs_diff(out, naive_gqa(q, k, v, scale));
  std::printf("GQA T=%lld S=%lld Hq=%lld Hkv=%lld: max abs err %.3g\n", (long long)p.t,
              (long long)p.s, (long long)p.hq, (long long)p.hkv, err);
  EXPECT_LT(err, kTol);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GqaTest,
                         ::testing::Values(GqaCase{1, 200, 6, 2, 40, 24},
                                           GqaCase{37, 200, 6, 2, 40, 24},
                                           GqaCase{37, 37, 4, 4, 33, 33},
                                           GqaCase{5, 9, 8, 1, 17, 29}));

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// Long enough that the kernels split the queries into several score chunks (the score buffer is
// bounded at 8M floats): exercises the chunk offsets of the causal mask.
TEST(AttentionChunks, GqaManyQueryChunks) {
  std::mt19937 rng(555);
  const int64_t t = 3000, s = 3100;  // T * S = 9.3M scores per head -> 2 chunks
  Tensor q = random_tensor({t, 1, 8}, rng, -1, 1), k = random_tensor({s, 1, 8}, rng, -1, 1);
  Tensor v = random_tensor({s, 1, 5}, rng, -1, 1), out = Tensor::empty({t, 1, 5});
  gqa_attention_forward(host_exec(), q, CacheView::contiguous(k), CacheView::contiguous(v), 0.9f,
                        out);
  EXPECT_LT(max_abs_diff(out, naive_gqa(q, k, v, 0.9)), kTol);
}

TEST(AttentionChunks, MlaAbsorbedManyQueryChunks) {
  std::mt19937 rng(556);
  const MlaDims m{5, 8, 4, 8, 16};
  const int64_t t = 1000, s = 2000;  // rows * S = 10M scores -> 2 chunks of queries
  Tensor q = random_tensor({t, 5, 12}, rng, -1, 1), c = random_tensor({s, 16}, rng, -1, 1);
  Tensor kr = random_tensor({s, 4}, rng, -1, 1),
         kv_b = random_tensor({5 * 16, 16}, rng, -0.4f, 0.4f);
  Tensor oa = Tensor::empty({t, 5, 8}), oe = Tensor::empty({t, 5, 8});
  mla_attention_absorbed(host_exec(), q, CacheView::contiguous(c), CacheView::contiguous(kr), kv_b,
                         m, 0.5f, oa);
  mla_attention_expanded(host_exec(), q, CacheView::contiguous(c), CacheView::contiguous(kr), kv_b,
                         m, 0.5f, oe);
  const auto ref = naive_mla(q, c, kr, kv_b, m, 0.5);
  EXPECT_LT(max_abs_diff(oa, ref), kTol);
  EXPECT_LT(max_abs_diff(oe, ref), kTol);
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// Scatters contiguous cache rows [S, row...] into a pool of `num_pages` pages of `page_size` rows
// at random distinct pages; returns the view (its page table lives in `pages`).
CacheView scatter_to_pages(const Tensor& rows, int64_t page_size, int64_t num_pages,
                           std::mt19937& rng, std::vector<int32_t>& pages) {
  const int64_t s = rows.dim(0);
  Shape pool_shape{num_pages, page_size};
  for (int d = 1; d < rows.ndim(); ++d) pool_shape.push_back(rows.dim(d));
  Tensor pool = Tensor::full(pool_shape, 1e30f);  // poison: unused rows must never be read
  std::vector<int32_t> all(num_pages);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  pages.assign(all.begin(), all.begin() + (s + page_size - 1) / page_size);
  CacheView v;
  v.pool = pool;
  v.pages = Tensor::wrap(pages.data(), {static_cast<int64_t>(pages.size())}, DType::kI32);
  v.length = s;
  cache_write_rows(host_exec(), v, 0, rows);
  return v;
}

TEST(PagedAttention, MlaAndGqaMatchContiguous) {
  std::mt19937 rng(901);
  const MlaDims m{4, 12, 6, 10, 20};
  for (int64_t page : {16, 64}) {
    for (auto [t, s] : {std::pair<int64_t, int64_t>{1, 150}, {29, 150}, {50, 50}, {1, 1}}) {
      Tensor q = random_tensor({t, 4, 18}, rng, -1, 1), c = random_tensor({s, 20}, rng, -1, 1);
      Tensor kr = random_tensor({s, 6}, rng, -1, 1),
             kv_b = random_tensor({4 * 22, 20}, rng, -0.4f, 0.4f);
      std::vector<int32_t> pc, pr;
      CacheView vc = scatter_to_pages(c, page, 20, rng, pc),
                vr = scatter_to_pages(kr, page, 20, rng, pr);
      const auto ref = naive_mla(q, c, kr, kv_b, m, 0.5);
      Tensor oa = Tensor::empty({t, 4, 10}), oe = Tensor::empty({t, 4, 10});
      mla_attention_absorbed(host_exec(), q, vc, vr, kv_b, m, 0.5f, oa);
      mla_attention_expanded(host_exec(), q, vc, vr, kv_b, m, 0.5f, oe);
      EXPECT_LT(max_abs_diff(oa, ref), kTol) << "page " << page << " T " << t << " S " << s;
      EXPECT_LT(max_abs_diff(oe, ref), kTol) << "page " << page << " T " << t << " S " << s;

      Tensor qg = random_tensor({t, 6, 9}, rng, -1, 1), k = random_tensor({s, 2, 9}, rng, -1, 1);
      Tensor v = random_tensor({s, 2, 7}, rng, -1, 1), og = Tensor::empty({t, 6, 7});
      std::vector<int32_t> pk, pv;
      CacheView vk = scatter_to_pages(k, page, 20, rng, pk),
                vv = scatter_to_pages(v, page, 20, rng, pv);
      gqa_attention_forward(host_exec(), qg, vk, vv, 0.7f, og);
      EXPECT_LT(max_abs_diff(og, naive_gqa(qg, k, v, 0.7)), kTol) << "page " << page;
    }
  }
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

bool bit_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() &&
         std::equal(a.data<float>(), a.data<float>() + a.numel(), b.data<float>());
}

// A varlen batch over paged pools: sequence b adds lens[b] rows after past[b] cached positions, in
// shuffled pages of 16 rows (a page table padded with 0, spare pages never named).
struct VarlenBatch {
  std::vector<int64_t> lens, past, cu{0};
  int64_t B = 0, N = 0, num_pages = 0;
  static constexpr int64_t kPage = 16;
  Tensor table, cu_t, past_t;

  VarlenBatch(std::vector<int64_t> l, std::vector<int64_t> p, std::mt19937& rng)
      : lens(std::move(l)), past(std::move(p)), B(static_cast<int64_t>(lens.size())) {
    int64_t cols = 0, used = 0;
    for (int64_t b = 0; b < B; ++b) {
      cu.push_back(cu.back() + lens[b]);
      const int64_t need = (past[b] + lens[b] + kPage - 1) / kPage;
      cols = std::max(cols, need);
      used += need;
    }
    N = cu.back();
    num_pages = used + 5;
    std::vector<int32_t> ids(num_pages);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    table = Tensor::zeros({B, cols}, DType::kI32);
    cu_t = Tensor::empty({B + 1}, DType::kI64);
    past_t = Tensor::empty({B}, DType::kI64);
    std::copy(cu.begin(), cu.end(), cu_t.data<int64_t>());
    std::copy(past.begin(), past.end(), past_t.data<int64_t>());
    for (int64_t b = 0, next = 0; b < B; ++b)
      for (int64_t pg = 0; pg < (past[b] + lens[b] + kPage - 1) / kPage; ++pg)
        table.data<int32_t>()[b * cols + pg] = ids[next++];
  }
  CacheView view(const Tensor& pool, int64_t b) const {
    CacheView v;
    v.pool = pool;
    v.pages = table.select(b);
    v.length = past[b] + lens[b];
    return v;
  }
  Tensor rows(const Tensor& t, int64_t b) const { return t.slice(0, cu[b], cu[b + 1]); }
};

// Every varlen op equals its per-sequence op on each sequence's view, bit for bit (the same code
// runs), cache writes included; MLA takes both forms across the batch.
TEST(VarlenAttention, EqualsPerSequenceOpsExactly) {
  std::mt19937 rng(950);
  const VarlenBatch vb({1, 7, 64, 65, 130, 1}, {0, 40, 3, 100, 0, 77}, rng);
  const int64_t B = vb.B, N = vb.N, num_pages = vb.num_pages, page = VarlenBatch::kPage;
  const std::vector<int64_t>&lens = vb.lens, &past = vb.past;
  const Tensor &table = vb.table, &cu_t = vb.cu_t, &past_t = vb.past_t;
  auto view = [&](const Tensor& pool, int64_t b) { return vb.view(pool, b); };
  auto rows = [&](const Tensor& t, int64_t b) { return vb.rows(t, b); };

  const MlaDims m{3, 12, 6, 10, 20};
  EXPECT_EQ(mla_attention_form(130, 130, m, false), MlaForm::kExpanded);
  EXPECT_EQ(mla_attention_form(1, 78, m, false), MlaForm::kAbsorbed);
  EXPECT_EQ(mla_attention_form(130, 130, m, true), MlaForm::kAbsorbed);
  for (bool invariant : {false, true}) {
    Exec ex = host_exec();
    ex.batch_invariant = invariant;
    // MLA: latent and rope rows written, then attention.
    const Tensor latent = random_tensor({num_pages, page, 20}, rng, -1, 1),
                 latent_want = latent.clone();
    const Tensor rope = random_tensor({num_pages, page, 6}, rng, -1, 1), rope_want = rope.clone();
    const Tensor c = random_tensor({N, 20}, rng, -1, 1), kr = random_tensor({N, 6}, rng, -1, 1);
    const Tensor q = random_tensor({N, 3, 18}, rng, -1, 1);
    const Tensor kv_b = random_tensor({3 * 22, 20}, rng, -0.4f, 0.4f);
    Tensor want = Tensor::empty({N, 3, 10}), got = Tensor::empty({N, 3, 10});
    for (int64_t b = 0; b < B; ++b) {
      cache_write_rows(ex, view(latent_want, b), past[b], rows(c, b));
      cache_write_rows(ex, view(rope_want, b), past[b], rows(kr, b));
      const auto attend =
          mla_attention_form(lens[b], past[b] + lens[b], m, invariant) == MlaForm::kAbsorbed
              ? mla_attention_absorbed
              : mla_attention_expanded;
      attend(ex, rows(q, b), view(latent_want, b), view(rope_want, b), kv_b, m, 0.5f,
             rows(want, b));
    }
    cache_write_varlen(ex, latent, table, cu_t, past_t, c);
    cache_write_varlen(ex, rope, table, cu_t, past_t, kr);
    mla_attention_varlen(ex, q, latent, rope, table, cu_t, past_t, kv_b, m, 0.5f, got);
    EXPECT_TRUE(bit_equal(latent, latent_want)) << "invariant " << invariant;
    EXPECT_TRUE(bit_equal(rope, rope_want)) << "invariant " << invariant;
    EXPECT_TRUE(bit_equal(got, want)) << "MLA, invariant " << invariant;

    // GQA: 6 query heads over 2 KV heads, d 9, dv 7.
    const Tensor kp = random_tensor({num_pages, page, 2, 9}, rng, -1, 1), kp_want = kp.clone();
    const Tensor vp = random_tensor({num_pages, page, 2, 7}, rng, -1, 1), vp_want = vp.clone();
    const Tensor k = random_tensor({N, 2, 9}, rng, -1, 1), v = random_tensor({N, 2, 7}, rng, -1, 1);
    const Tensor qg = random_tensor({N, 6, 9}, rng, -1, 1);
    Tensor gwant = Tensor::empty({N, 6, 7}), ggot = Tensor::empty({N, 6, 7});
    for (int64_t b = 0; b < B; ++b) {
      cache_write_rows(ex, view(kp_want, b), past[b], rows(k, b));
      cache_write_rows(ex, view(vp_want, b), past[b], rows(v, b));
      gqa_attention_forward(ex, rows(qg, b), view(kp_want, b), view(vp_want, b), 0.7f,
                            rows(gwant, b));
    }
    cache_write_varlen(ex, kp, table, cu_t, past_t, k);
    cache_write_varlen(ex, vp, table, cu_t, past_t, v);
    gqa_attention_varlen(ex, qg, kp, vp, table, cu_t, past_t, 0.7f, ggot);
    EXPECT_TRUE(bit_equal(kp, kp_want) && bit_equal(vp, vp_want)) << "invariant " << invariant;
    EXPECT_TRUE(bit_equal(ggot, gwant)) << "GQA, invariant " << invariant;
  }
}

Tensor widen(const Tensor& bf16_pool) {
  Tensor f = Tensor::empty(bf16_pool.shape());
  for (int64_t i = 0; i < f.numel(); ++i)
    f.data<float>()[i] = bf16_to_f32(bf16_pool.data<uint16_t>()[i]);
  return f;
}

Tensor random_bf16_pool(Shape shape, std::mt19937& rng) {
  Tensor t = Tensor::empty(shape, DType::kBF16);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<uint16_t>()[i] = f32_to_bf16(dist(rng));
  return t;
}

// bf16 pages (--kv_dtype bf16) on the CPU: a write stores each value rounded to nearest even and
// leaves every other row alone, and attention over bf16 pages equals, bit for bit, attention
// over f32 pages holding the same (widened) values: the CPU widens a page at a time, exactly.
// This is the reference the GPU's bf16 pages are held to (tests/gpu/model_cuda_test.cc).
TEST(VarlenAttention, Bf16PagesEqualF32PagesOfTheSameValues) {
  std::mt19937 rng(951);
  const VarlenBatch vb({1, 9, 64, 33, 1}, {0, 40, 3, 100, 77}, rng);
  const int64_t N = vb.N, P = vb.num_pages, page = VarlenBatch::kPage;
  const MlaDims m{3, 12, 6, 10, 20};
  for (bool invariant : {false, true}) {
    Exec ex = host_exec();
    ex.batch_invariant = invariant;
    const Tensor latent = random_bf16_pool({P, page, 20}, rng),
                 rope = random_bf16_pool({P, page, 6}, rng);
    const Tensor latent_before = widen(latent), rope_before = widen(rope);
    const Tensor c = random_tensor({N, 20}, rng, -1, 1), kr = random_tensor({N, 6}, rng, -1, 1);
    cache_write_varlen(ex, latent, vb.table, vb.cu_t, vb.past_t, c);
    cache_write_varlen(ex, rope, vb.table, vb.cu_t, vb.past_t, kr);
    // Written rows hold the rounded values; every other row is unchanged.
    const Tensor latent_f = widen(latent), rope_f = widen(rope);
    int64_t written = 0;
    for (int64_t b = 0; b < vb.B; ++b)
      for (int64_t i = 0; i < vb.lens[b]; ++i) {
        const CacheView lv = vb.view(latent_f, b), rv = vb.view(rope_f, b);
        const int64_t j = vb.past[b] + i, r = vb.cu[b] + i;
        for (int64_t e = 0; e < 20; ++e)
          ASSERT_EQ(lv.row(j)[e], bf16_to_f32(f32_to_bf16(c.data<float>()[r * 20 + e])));
        for (int64_t e = 0; e < 6; ++e)
          ASSERT_EQ(rv.row(j)[e], bf16_to_f32(f32_to_bf16(kr.data<float>()[r * 6 + e])));
        // Mark the row in the "before" copies so that the comparison below skips it.
        std::copy(lv.row(j), lv.row(j) + 20, vb.view(latent_before, b).row(j));
        std::copy(rv.row(j), rv.row(j) + 6, vb.view(rope_before, b).row(j));
        ++written;
      }
    EXPECT_EQ(written, N);
    EXPECT_TRUE(bit_equal(latent_f, latent_before) && bit_equal(rope_f, rope_before));

    const Tensor q = random_tensor({N, 3, 18}, rng, -1, 1);
    const Tensor kv_b = random_tensor({3 * 22, 20}, rng, -0.4f, 0.4f);
    Tensor got = Tensor::empty({N, 3, 10}), want = Tensor::empty({N, 3, 10});
    mla_attention_varlen(ex, q, latent, rope, vb.table, vb.cu_t, vb.past_t, kv_b, m, 0.5f, got);
    mla_attention_varlen(ex, q, latent_f, rope_f, vb.table, vb.cu_t, vb.past_t, kv_b, m, 0.5f,
                         want);
    EXPECT_TRUE(bit_equal(got, want)) << "MLA, invariant " << invariant;

    const Tensor kp = random_bf16_pool({P, page, 2, 9}, rng),
                 vp = random_bf16_pool({P, page, 2, 7}, rng);
    const Tensor k = random_tensor({N, 2, 9}, rng, -1, 1), v = random_tensor({N, 2, 7}, rng, -1, 1);
    cache_write_varlen(ex, kp, vb.table, vb.cu_t, vb.past_t, k);
    cache_write_varlen(ex, vp, vb.table, vb.cu_t, vb.past_t, v);
    const Tensor qg = random_tensor({N, 6, 9}, rng, -1, 1);
    Tensor ggot = Tensor::empty({N, 6, 7}), gwant = Tensor::empty({N, 6, 7});
    gqa_attention_varlen(ex, qg, kp, vp, vb.table, vb.cu_t, vb.past_t, 0.7f, ggot);
    gqa_attention_varlen(ex, qg, widen(kp), widen(vp), vb.table, vb.cu_t, vb.past_t, 0.7f, gwant);
    EXPECT_TRUE(bit_equal(ggot, gwant)) << "GQA, invariant " << invariant;
  }
}

}  // namespace
}  // namespace loom
