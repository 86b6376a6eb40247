// moe_route against a naive grouped top-k and hand-derived cases; the expert path (moe_permute,
// moe_grouped_swiglu, moe_unpermute_combine, LocalExpertDispatcher) against counting and
// double-precision per-token oracles, alone and composed, over the whole expert set and over an
// owned range (expert parallelism's per-rank piece).
#include "kernels/moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "core/workspace.h"
#include "engine/parallel/local_expert_dispatcher.h"
#include "kernels/elementwise.h"

namespace loom {
namespace {

Tensor random_tensor(Shape shape, std::mt19937& rng, float lo, float hi) {
  Tensor t = Tensor::empty(shape);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

struct Routed {
  std::vector<int> ids;
  std::vector<float> w;
};

Routed route(const std::vector<float>& logits, int64_t t, int64_t e, const std::vector<float>* bias,
             const RouterParams& p) {
  Tensor l = Tensor::empty({t, e});
  std::copy(logits.begin(), logits.end(), l.data<float>());
  Tensor b;
  if (bias) {
    b = Tensor::empty({e});
    std::copy(bias->begin(), bias->end(), b.data<float>());
  }
  Tensor ids = Tensor::empty({t, p.top_k}, DType::kI32), w = Tensor::empty({t, p.top_k});
  moe_route(host_exec(), l, b, p, ids, w);
  Routed r;
  r.ids.assign(ids.data<int32_t>(), ids.data<int32_t>() + t * p.top_k);
  r.w.assign(w.data<float>(), w.data<float>() + t * p.top_k);
  return r;
}

// Naive mirror of HF DeepseekV3TopkRouter / KimiLinearTopkRouter (sigmoid) and
// Qwen2MoeTopKRouter (softmax), written as literally as possible: full sorts, explicit masks.
// Scores are computed with the same f32 formulas as the kernel so near-ties cannot flip.
Routed naive_route(const std::vector<float>& logits, int64_t t, int64_t e,
                   const std::vector<float>* bias, const RouterParams& p) {
  Routed r;
  const float ninf = -std::numeric_limits<float>::infinity();
  auto sorted_desc = [](const std::vector<float>& v) {  // stable: ties keep the lower index
    std::vector<int> idx(v.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return v[a] > v[b]; });
    return idx;
  };
  for (int64_t i = 0; i < t; ++i) {
    std::vector<float> s(e);
    if (p.score == RouterScore::kSigmoid) {
      for (int64_t j = 0; j < e; ++j) s[j] = 1.0f / (1.0f + std::exp(-logits[i * e + j]));
    } else {
      float mx = ninf, sum = 0.0f;
      for (int64_t j = 0; j < e; ++j) mx = std::max(mx, logits[i * e + j]);
      for (int64_t j = 0; j < e; ++j) sum += (s[j] = std::exp(logits[i * e + j] - mx));
      for (int64_t j = 0; j < e; ++j) s[j] /= sum;
    }
    std::vector<float> choice(e);
    for (int64_t j = 0; j < e; ++j) choice[j] = s[j] + (bias ? (*bias)[j] : 0.0f);
    const int64_t gs = e / p.n_group;
    std::vector<float> gscore(p.n_group);
    for (int g = 0; g < p.n_group; ++g) {
      std::vector<float> v(choice.begin() + g * gs, choice.begin() + (g + 1) * gs);
      std::sort(v.rbegin(), v.rend());
      gscore[g] = v[0] + v[1];
    }
    auto gorder = sorted_desc(gscore);
    std::vector<bool> keep(p.n_group, false);
    for (int g = 0; g < p.topk_group; ++g) keep[gorder[g]] = true;
    for (int64_t j = 0; j < e; ++j) {
      if (!keep[j / gs]) choice[j] = ninf;
    }
    auto order = sorted_desc(choice);
    double sum = 0.0;
    for (int k = 0; k < p.top_k; ++k) sum += s[order[k]];
    for (int k = 0; k < p.top_k; ++k) {
      r.ids.push_back(order[k]);
      double w = s[order[k]];
      if (p.renormalize) w /= (p.score == RouterScore::kSigmoid ? sum + 1e-20 : sum);
      r.w.push_back(static_cast<float>(w * p.routed_scaling));
    }
  }
  return r;
}

void expect_same(const Routed& a, const Routed& b, double wtol) {
  ASSERT_EQ(a.ids, b.ids);
  for (size_t i = 0; i < a.w.size(); ++i) ASSERT_NEAR(a.w[i], b.w[i], wtol) << i;
}

struct RouterCase {
  RouterScore score;
  int e, top_k, n_group, topk_group;
  bool bias, renorm;
  float scaling;
};
class RouterTest : public ::testing::TestWithParam<RouterCase> {};

// Weights: one f32 sigmoid/softmax then a k-term sum and a divide: ~1e-6 relative of O(1)
// values times routed_scaling (<= 2.5): 1e-5 absolute.
TEST_P(RouterTest, MatchesNaiveGroupedTopK) {
  const RouterCase c = GetParam();
  std::mt19937 rng(static_cast<unsigned>(c.e * 31 + c.top_k * 7 + c.n_group));
  const int64_t t = 53;
  std::vector<float> logits(t * c.e), bias(c.e);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (auto& v : logits) v = nd(rng);
  std::uniform_real_distribution<float> bd(-0.3f, 0.3f);
  for (auto& v : bias) v = bd(rng);
  RouterParams p;
  p.score = c.score;
  p.top_k = c.top_k;
  p.n_group = c.n_group;
  p.topk_group = c.topk_group;
  p.renormalize = c.renorm;
  p.routed_scaling = c.scaling;
  const std::vector<float>* bp = c.bias ? &bias : nullptr;
  expect_same(route(logits, t, c.e, bp, p), naive_route(logits, t, c.e, bp, p), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(
    Configs, RouterTest,
    ::testing::Values(
        // deepseek_v3-like: 8 groups, keep 4, top 8, bias, renorm, scaling 2.5 (E scaled down)
        RouterCase{RouterScore::kSigmoid, 64, 8, 8, 4, true, true, 2.5f},
        // kimi_linear-like: one group
        RouterCase{RouterScore::kSigmoid, 48, 6, 1, 1, true, true, 2.446f},
        RouterCase{RouterScore::kSigmoid, 30, 3, 5, 2, false, false, 1.0f},
        RouterCase{RouterScore::kSigmoid, 32, 4, 4, 1, true, true, 1.0f},
        // qwen3_next-like softmax routers
        RouterCase{RouterScore::kSoftmax, 50, 10, 1, 1, false, true, 1.0f},
        RouterCase{RouterScore::kSoftmax, 50, 4, 1, 1, false, false, 1.0f}));

TEST(RouterHand, GroupMaskExcludesBestExpert) {
  // logits 0 -> s = 0.5 everywhere; selection = 0.5 + bias = [0.6, 0.5, 0.8, 0.0].
  // Groups {0,1}: 0.6 + 0.5 = 1.1; {2,3}: 0.8 + 0.0 = 0.8 -> keep group 0 only, so expert 2
  // (the best single score) is masked. Top-2 of {0, 1}: [0, 1]. Weights are the unbiased
  // s = [0.5, 0.5] -> renormalised [0.5, 0.5] -> times 2.5 = [1.25, 1.25].
  RouterParams p;
  p.top_k = 2;
  p.n_group = 2;
  p.topk_group = 1;
  p.routed_scaling = 2.5f;
  std::vector<float> bias = {0.1f, 0.0f, 0.3f, -0.5f};
  auto r = route({0, 0, 0, 0}, 1, 4, &bias, p);
  EXPECT_EQ(r.ids, (std::vector<int>{0, 1}));
  EXPECT_NEAR(r.w[0], 1.25f, 1e-6);
  EXPECT_NEAR(r.w[1], 1.25f, 1e-6);
  // Without grouping the top-2 is [2, 0] with weights 0.5, 0.5 -> 1.25 each.
  p.n_group = 1;
  r = route({0, 0, 0, 0}, 1, 4, &bias, p);
  EXPECT_EQ(r.ids, (std::vector<int>{2, 0}));
}

TEST(RouterHand, SigmoidValues) {
  // logits [ln 3, 0, -ln 3] -> s = [0.75, 0.5, 0.25]; top-2 = [0, 1].
  RouterParams p;
  p.top_k = 2;
  p.renormalize = false;
  const float l3 = std::log(3.0f);
  auto r = route({l3, 0.0f, -l3}, 1, 3, nullptr, p);
  EXPECT_EQ(r.ids, (std::vector<int>{0, 1}));
  EXPECT_NEAR(r.w[0], 0.75f, 1e-6);
  EXPECT_NEAR(r.w[1], 0.5f, 1e-6);
  p.renormalize = true;  // 0.75 / 1.25 = 0.6, 0.5 / 1.25 = 0.4
  r = route({l3, 0.0f, -l3}, 1, 3, nullptr, p);
  EXPECT_NEAR(r.w[0], 0.6f, 1e-6);
  EXPECT_NEAR(r.w[1], 0.4f, 1e-6);
}

TEST(RouterHand, SoftmaxValues) {
  // logits ln[1, 2, 3, 4] -> p = [0.1, 0.2, 0.3, 0.4]; top-2 = [3, 2] with [0.4, 0.3];
  // renormalised [4/7, 3/7].
  RouterParams p;
  p.score = RouterScore::kSoftmax;
  p.top_k = 2;
  p.renormalize = false;
  std::vector<float> l = {0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  auto r = route(l, 1, 4, nullptr, p);
  EXPECT_EQ(r.ids, (std::vector<int>{3, 2}));
  EXPECT_NEAR(r.w[0], 0.4f, 1e-6);
  EXPECT_NEAR(r.w[1], 0.3f, 1e-6);
  p.renormalize = true;
  r = route(l, 1, 4, nullptr, p);
  EXPECT_NEAR(r.w[0], 4.0f / 7.0f, 1e-6);
  EXPECT_NEAR(r.w[1], 3.0f / 7.0f, 1e-6);
}

TEST(RouterHand, TiesPreferLowerIndex) {
  RouterParams p;
  p.top_k = 3;
  auto r = route({1, 2, 1, 2, 1}, 1, 5, nullptr, p);
  EXPECT_EQ(r.ids, (std::vector<int>{1, 3, 0}));
}

TEST(RouterHand, MaskedExpertsAreMinusInfinity) {
  // Negative selection scores: s = 0.5, bias = [-1.0, -1.1, -1.2, -1.3] -> [-0.5, -0.6, -0.7,
  // -0.8]. Group {0,1} (-1.1) beats {2,3} (-1.5). With masked experts at -inf (kimi_linear in HF,
  // MODELS.md) top-1 is expert 0; a 0.0 fill (older HF deepseek_v3) would pick expert 2.
  RouterParams p;
  p.top_k = 1;
  p.n_group = 2;
  p.topk_group = 1;
  std::vector<float> bias = {-1.0f, -1.1f, -1.2f, -1.3f};
  auto r = route({0, 0, 0, 0}, 1, 4, &bias, p);
  EXPECT_EQ(r.ids, (std::vector<int>{0}));
  EXPECT_NEAR(r.w[0], 1.0f, 1e-6);  // renormalised single weight
}

// ---- experts: permute -> grouped SwiGLU -> unpermute and combine ----

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

Tensor i32_tensor(Shape shape, int32_t value) {
  Tensor t = Tensor::empty(shape, DType::kI32);
  std::fill(t.data<int32_t>(), t.data<int32_t>() + t.numel(), value);
  return t;
}

std::vector<int32_t> values(const Tensor& t) {
  return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + t.numel());
}

// k experts per token out of e: distinct like a router's, or with repeats (the kernels allow them).
Tensor random_choices(int64_t t, int64_t k, int64_t e, bool distinct, std::mt19937& rng) {
  Tensor ids = Tensor::empty({t, k}, DType::kI32);
  std::vector<int> perm(e);
  std::iota(perm.begin(), perm.end(), 0);
  std::uniform_int_distribution<int> any(0, static_cast<int>(e) - 1);
  for (int64_t i = 0; i < t; ++i) {
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t j = 0; j < k; ++j) ids.at<int32_t>({i, j}) = distinct ? perm[j] : any(rng);
  }
  return ids;
}

struct Experts {
  Tensor gate, up, down;  // [E, I, D], [E, I, D], [E, D, I]

  Experts range(int64_t first, int64_t count) const {  // owned copies, like a rank's shard
    return {gate.slice(0, first, first + count).clone(), up.slice(0, first, first + count).clone(),
            down.slice(0, first, first + count).clone()};
  }
};

Experts random_experts(int64_t e, int64_t inter, int64_t d, std::mt19937& rng) {
  const float sg = 1.5f / std::sqrt(float(d)), sd = 1.5f / std::sqrt(float(inter));
  Experts w;
  w.gate = random_tensor({e, inter, d}, rng, -sg, sg);
  w.up = random_tensor({e, inter, d}, rng, -sg, sg);
  w.down = random_tensor({e, d, inter}, rng, -sd, sd);
  return w;
}

// down(silu(gate(x)) * up(x)) of expert `ex` on the row x[0..D), in double.
std::vector<double> expert_ref(const Experts& w, int64_t ex, const float* x) {
  const int64_t inter = w.gate.dim(1), d = w.gate.dim(2);
  std::vector<double> h(inter), y(d, 0.0);
  for (int64_t a = 0; a < inter; ++a) {
    double g = 0.0, u = 0.0;
    for (int64_t b = 0; b < d; ++b) {
      g += double(w.gate.at<float>({ex, a, b})) * x[b];
      u += double(w.up.at<float>({ex, a, b})) * x[b];
    }
    h[a] = g / (1.0 + std::exp(-g)) * u;
  }
  for (int64_t b = 0; b < d; ++b) {
    for (int64_t a = 0; a < inter; ++a) y[b] += double(w.down.at<float>({ex, b, a})) * h[a];
  }
  return y;
}

// The routed-expert output per token, [T * D] in double, counting only the choices whose expert
// is in [first, first + count).
std::vector<double> layer_ref(const Tensor& x, const Tensor& ids, const Tensor& wts,
                              const Experts& w, int64_t first, int64_t count) {
  const int64_t t = x.dim(0), d = x.dim(1), k = ids.dim(1);
  std::vector<double> out(t * d, 0.0);
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t ex = ids.at<int32_t>({i, j});
      if (ex < first || ex >= first + count) continue;
      const std::vector<double> y = expert_ref(w, ex, x.data<float>() + i * d);
      for (int64_t b = 0; b < d; ++b) out[i * d + b] += wts.at<float>({i, j}) * y[b];
    }
  }
  return out;
}

double max_abs_diff(const Tensor& out, const std::vector<double>& ref) {
  double m = 0.0;
  for (int64_t i = 0; i < out.numel(); ++i) {
    const double diff = std::abs(out.data<float>()[i] - ref[i]);
    m = std::isnan(diff) ? std::numeric_limits<double>::infinity() : std::max(m, diff);
  }
  return m;
}

bool rows_equal(const float* a, const float* b, int64_t d) {
  return d == 0 || std::memcmp(a, b, d * sizeof(float)) == 0;
}

// Router -> LocalExpertDispatcher -> grouped GEMMs -> combine, as MoeFfn runs it.
Tensor run_local_layer(const Exec& ex, const Tensor& x, const Tensor& ids, const Tensor& wts,
                       const Experts& w) {
  LocalExpertDispatcher dispatcher(w.gate.dim(0));
  const Workspace::Mark scope(*ex.workspace);
  const Dispatched d = dispatcher.dispatch(ex, x, ids, wts, *ex.workspace);
  Tensor y = ex.workspace->take(d.rows.shape());
  moe_grouped_swiglu(ex, d.rows, d.offsets, w.gate, w.up, w.down, y);
  Tensor out = Tensor::full({x.dim(0), x.dim(1)}, kNaN);
  dispatcher.combine(ex, y, d, out);
  return out;
}

struct PermuteCase {
  int64_t t, d, e, k, first, count;
  bool distinct;
};
class PermuteTest : public ::testing::TestWithParam<PermuteCase> {};

// Offsets and rows against a counting oracle (expert by expert, its slots in ascending order),
// then the round trip: combining x_sorted with weight 1 on one owned choice per token (0 on the
// others) gives x back bit for bit, and zeros for tokens with no owned choice.
TEST_P(PermuteTest, MatchesCountingOracleAndRoundTrips) {
  const PermuteCase c = GetParam();
  std::mt19937 rng(static_cast<unsigned>(c.t * 17 + c.e * 5 + c.first));
  const int64_t slots = c.t * c.k, spare = 3;
  Tensor x = random_tensor({c.t, c.d}, rng, -2, 2);
  Tensor ids = random_choices(c.t, c.k, c.e, c.distinct, rng);
  Tensor offsets = i32_tensor({c.count + 1}, -7), rows = i32_tensor({c.t, c.k}, -7);
  Tensor xs = Tensor::full({slots + spare, c.d}, kNaN);
  moe_permute(host_exec(), x, ids, c.first, c.e, offsets, rows, xs);

  std::vector<int32_t> want_offsets = {0}, want_rows(slots, -1);
  int32_t next = 0;
  for (int64_t e = 0; e < c.count; ++e) {
    for (int64_t j = 0; j < slots; ++j) {
      if (ids.data<int32_t>()[j] == c.first + e) want_rows[j] = next++;
    }
    want_offsets.push_back(next);
  }
  ASSERT_EQ(values(offsets), want_offsets);
  ASSERT_EQ(values(rows), want_rows);
  for (int64_t j = 0; j < slots; ++j) {
    if (want_rows[j] < 0) continue;
    ASSERT_TRUE(
        rows_equal(xs.data<float>() + want_rows[j] * c.d, x.data<float>() + (j / c.k) * c.d, c.d))
        << "slot " << j;
  }
  for (int64_t i = next * c.d; i < xs.numel(); ++i) ASSERT_TRUE(std::isnan(xs.data<float>()[i]));

  Tensor one_hot = Tensor::zeros({c.t, c.k});
  std::vector<bool> owned(c.t, false);
  for (int64_t i = 0; i < c.t; ++i) {
    std::vector<int64_t> mine;
    for (int64_t j = 0; j < c.k; ++j) {
      if (want_rows[i * c.k + j] >= 0) mine.push_back(j);
    }
    if (mine.empty()) continue;
    owned[i] = true;
    one_hot.at<float>({i, mine[rng() % mine.size()]}) = 1.0f;
  }
  Tensor back = Tensor::full({c.t, c.d}, kNaN);
  moe_unpermute_combine(host_exec(), xs, rows, one_hot, back);
  const std::vector<float> zeros(c.d, 0.0f);
  for (int64_t i = 0; i < c.t; ++i) {
    const float* want = owned[i] ? x.data<float>() + i * c.d : zeros.data();
    ASSERT_TRUE(rows_equal(back.data<float>() + i * c.d, want, c.d)) << "token " << i;
  }
}

// combine with an addend (an MoE layer's shared expert output) is the combine followed by
// add_inplace, bit for bit, on every token, with or without owned slots.
TEST_P(PermuteTest, CombineWithAddendIsCombineThenAdd) {
  const PermuteCase c = GetParam();
  std::mt19937 rng(static_cast<unsigned>(c.t * 11 + c.k));
  const int64_t r = c.t * c.k;
  Tensor y = random_tensor({r, c.d}, rng, -1, 1);
  std::vector<int32_t> row_ids(static_cast<size_t>(r));
  std::iota(row_ids.begin(), row_ids.end(), 0);
  std::shuffle(row_ids.begin(), row_ids.end(), rng);
  Tensor rows = Tensor::empty({c.t, c.k}, DType::kI32);
  for (int64_t j = 0; j < r; ++j) rows.data<int32_t>()[j] = rng() % 4 == 0 ? -1 : row_ids[j];
  const Tensor wts = random_tensor({c.t, c.k}, rng, 0.0f, 1.0f);
  const Tensor addend = random_tensor({c.t, c.d}, rng, -1, 1);
  Tensor want = Tensor::full({c.t, c.d}, kNaN), got = Tensor::full({c.t, c.d}, kNaN);
  moe_unpermute_combine(host_exec(), y, rows, wts, want);
  add_inplace(host_exec(), want, addend);
  moe_unpermute_combine(host_exec(), y, rows, wts, got, addend);
  for (int64_t i = 0; i < c.t; ++i)
    ASSERT_TRUE(rows_equal(got.data<float>() + i * c.d, want.data<float>() + i * c.d, c.d))
        << "token " << i;
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PermuteTest,
    ::testing::Values(PermuteCase{37, 13, 7, 3, 0, 7, true}, PermuteCase{1, 5, 4, 4, 0, 4, true},
                      PermuteCase{53, 29, 11, 2, 0, 11, false},
                      PermuteCase{53, 29, 11, 3, 3, 5, false}, PermuteCase{19, 7, 9, 5, 8, 1, true},
                      PermuteCase{23, 6, 6, 3, 2, 0, true}, PermuteCase{0, 8, 3, 2, 0, 3, true}));

struct GroupedCase {
  int64_t d, inter;
  std::vector<int32_t> rows_per_expert;
};
class GroupedTest : public ::testing::TestWithParam<GroupedCase> {};

TEST_P(GroupedTest, MatchesNaiveDouble) {
  const GroupedCase c = GetParam();
  const int64_t ne = static_cast<int64_t>(c.rows_per_expert.size()), spare = 4;
  std::mt19937 rng(static_cast<unsigned>(c.d * 7 + c.inter + ne));
  Tensor offsets = Tensor::empty({ne + 1}, DType::kI32);
  offsets.data<int32_t>()[0] = 0;
  for (int64_t e = 0; e < ne; ++e) {
    offsets.data<int32_t>()[e + 1] = offsets.data<int32_t>()[e] + c.rows_per_expert[e];
  }
  const int64_t kept = offsets.data<int32_t>()[ne], r = kept + spare;
  Tensor x = random_tensor({r, c.d}, rng, -1, 1);
  const Experts w = random_experts(ne, c.inter, c.d, rng);
  Tensor y = Tensor::full({r, c.d}, kNaN);
  moe_grouped_swiglu(host_exec(), x, offsets, w.gate, w.up, w.down, y);
  double max_err = 0.0;
  for (int64_t e = 0; e < ne; ++e) {
    for (int64_t row = offsets.data<int32_t>()[e]; row < offsets.data<int32_t>()[e + 1]; ++row) {
      const std::vector<double> want = expert_ref(w, e, x.data<float>() + row * c.d);
      for (int64_t b = 0; b < c.d; ++b) {
        max_err = std::max(max_err, std::abs(y.at<float>({row, b}) - want[b]));
      }
    }
  }
  std::printf("moe_grouped_swiglu D=%lld I=%lld rows=%lld: max abs err %.3g\n", (long long)c.d,
              (long long)c.inter, (long long)kept, max_err);
  // O(1) activations, f32 dot products of length <= 129 (measured <= 3e-7): 2e-6.
  EXPECT_LT(max_err, 2e-6);
  for (int64_t i = kept * c.d; i < y.numel(); ++i) ASSERT_TRUE(std::isnan(y.data<float>()[i]));
}

INSTANTIATE_TEST_SUITE_P(Shapes, GroupedTest,
                         ::testing::Values(GroupedCase{129, 71, {5, 0, 17, 1, 0, 9}},
                                           GroupedCase{40, 24, {1}},
                                           GroupedCase{33, 17, {0, 0, 64}},
                                           GroupedCase{8, 5, {0, 0}}));

struct LayerCase {
  int64_t t, d, inter, e, k;
};
class LocalDispatcherTest : public ::testing::TestWithParam<LayerCase> {};

TEST_P(LocalDispatcherTest, MatchesPerTokenReference) {
  const LayerCase c = GetParam();
  std::mt19937 rng(static_cast<unsigned>(c.t * 13 + c.e));
  Tensor x = random_tensor({c.t, c.d}, rng, -1, 1);
  const Experts w = random_experts(c.e, c.inter, c.d, rng);
  Tensor ids = random_choices(c.t, c.k, c.e, true, rng);
  Tensor wts = random_tensor({c.t, c.k}, rng, 0.0f, 1.0f);
  Workspace ws(Device::kCpu);
  Exec ex;
  ex.workspace = &ws;
  Tensor out = run_local_layer(ex, x, ids, wts, w);
  const double max_err = max_abs_diff(out, layer_ref(x, ids, wts, w, 0, c.e));
  std::printf("moe layer T=%lld: max abs err %.3g\n", (long long)c.t, max_err);
  // As GroupedTest, plus a sum of k <= 4 terms with weights in [0, 1]: 3e-6.
  EXPECT_LT(max_err, 3e-6);
  // Repeatable bit for bit.
  Tensor out2 = run_local_layer(ex, x, ids, wts, w);
  for (int64_t i = 0; i < out.numel(); ++i) ASSERT_EQ(out.data<float>()[i], out2.data<float>()[i]);
}

// In batch-invariant mode a token's output does not depend on the tokens beside it: the rows of
// a slice of the batch equal the full batch's bit for bit.
TEST_P(LocalDispatcherTest, BatchInvariantRowsMatchAnySlice) {
  const LayerCase c = GetParam();
  std::mt19937 rng(static_cast<unsigned>(c.t * 29 + c.e));
  Tensor x = random_tensor({c.t, c.d}, rng, -1, 1);
  const Experts w = random_experts(c.e, c.inter, c.d, rng);
  Tensor ids = random_choices(c.t, c.k, c.e, true, rng);
  Tensor wts = random_tensor({c.t, c.k}, rng, 0.0f, 1.0f);
  Workspace ws(Device::kCpu);
  Exec ex;
  ex.workspace = &ws;
  ex.batch_invariant = true;
  Tensor full = run_local_layer(ex, x, ids, wts, w);
  const std::vector<std::pair<int64_t, int64_t>> slices = {
      {0, 1}, {c.t / 2, c.t / 2 + 1}, {c.t - 1, c.t}, {c.t / 3, c.t}};
  for (const auto& [b, e] : slices) {
    Tensor part = run_local_layer(ex, x.slice(0, b, e), ids.slice(0, b, e), wts.slice(0, b, e), w);
    for (int64_t i = b; i < e; ++i) {
      ASSERT_TRUE(rows_equal(part.data<float>() + (i - b) * c.d, full.data<float>() + i * c.d, c.d))
          << "row " << i << " of slice [" << b << ", " << e << ")";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LocalDispatcherTest,
                         ::testing::Values(LayerCase{37, 129, 71, 7, 3}, LayerCase{1, 40, 24, 6, 4},
                                           LayerCase{64, 33, 17, 5, 1}));

// Expert parallelism's per-rank piece: a rank holding only experts [first, first + count) keeps
// only the slots routed to them, computes them with its weight shard, and contributes nothing
// for the others; the ranks' partial outputs add up to the whole layer.
TEST(ExpertRangeTest, RanksComputeOnlyTheirExpertsAndSumToTheLayer) {
  const int64_t t = 41, d = 24, inter = 19, e = 7, k = 3;
  std::mt19937 rng(4242);
  Tensor x = random_tensor({t, d}, rng, -1, 1);
  const Experts w = random_experts(e, inter, d, rng);
  Tensor ids = random_choices(t, k, e, true, rng);
  Tensor wts = random_tensor({t, k}, rng, 0.0f, 1.0f);
  Workspace ws(Device::kCpu);
  Exec ex;
  ex.workspace = &ws;
  const Tensor whole = run_local_layer(ex, x, ids, wts, w);

  std::vector<double> sum(t * d, 0.0);
  for (const auto& [first, count] : {std::pair<int64_t, int64_t>{0, 3}, {3, 1}, {4, 3}}) {
    const Experts shard = w.range(first, count);
    Tensor offsets = Tensor::empty({count + 1}, DType::kI32);
    Tensor rows = Tensor::empty({t, k}, DType::kI32);
    Tensor xs = Tensor::full({t * k, d}, kNaN);
    moe_permute(ex, x, ids, first, e, offsets, rows, xs);
    int64_t owned_slots = 0;
    for (int64_t j = 0; j < t * k; ++j) {
      const int32_t id = ids.data<int32_t>()[j];
      owned_slots += id >= first && id < first + count;
    }
    EXPECT_EQ(offsets.data<int32_t>()[count], owned_slots);
    Tensor y = Tensor::full({t * k, d}, kNaN);  // rows past the owned ones must never be read
    moe_grouped_swiglu(ex, xs, offsets, shard.gate, shard.up, shard.down, y);
    Tensor part = Tensor::full({t, d}, kNaN);
    moe_unpermute_combine(ex, y, rows, wts, part);

    const double err = max_abs_diff(part, layer_ref(x, ids, wts, w, first, count));
    std::printf("experts [%lld, %lld): %lld slots, max abs err %.3g\n", (long long)first,
                (long long)(first + count), (long long)owned_slots, err);
    EXPECT_LT(err, 3e-6);
    for (int64_t i = 0; i < t; ++i) {
      bool any = false;
      for (int64_t j = 0; j < k; ++j) any |= rows.at<int32_t>({i, j}) >= 0;
      if (!any) {
        for (int64_t b = 0; b < d; ++b) ASSERT_EQ(part.at<float>({i, b}), 0.0f);
      }
      for (int64_t b = 0; b < d; ++b) sum[i * d + b] += part.at<float>({i, b});
    }
  }
  const double err = max_abs_diff(whole, sum);
  std::printf("sum of ranks vs whole layer: max abs diff %.3g\n", err);
  // Three partial f32 sums re-added in another order: a few ulps of O(1) values.
  EXPECT_LT(err, 2e-6);
}

// The experts' weights rounded to bf16-representable values, as bf16 tensors and as f32 ones.
struct Bf16Experts {
  Experts f32;
  Tensor gate, up, down;  // bf16, the same values
};
Tensor to_bf16(const Tensor& t) {  // of bf16-representable f32 values: exact
  Tensor b = Tensor::empty(t.shape(), DType::kBF16);
  for (int64_t i = 0; i < t.numel(); ++i) b.data<uint16_t>()[i] = f32_to_bf16(t.data<float>()[i]);
  return b;
}
Bf16Experts random_bf16_experts(int64_t e, int64_t inter, int64_t d, std::mt19937& rng) {
  Bf16Experts w{random_experts(e, inter, d, rng), {}, {}, {}};
  for (Tensor* t : {&w.f32.gate, &w.f32.up, &w.f32.down}) {
    for (int64_t i = 0; i < t->numel(); ++i)
      t->data<float>()[i] = bf16_to_f32(f32_to_bf16(t->data<float>()[i]));
  }
  w.gate = to_bf16(w.f32.gate);
  w.up = to_bf16(w.f32.up);
  w.down = to_bf16(w.f32.down);
  return w;
}

// bf16 expert weights with f32 rows: the f32-weight numbers of the same values, against the
// double oracle and against the f32 weights (experts with 0, 1, few and many rows: the few-row
// kernel, which gives the f32 weights' bits for 2 to 8 rows, and OpenBLAS on widened panels,
// within f32 rounding); in batch-invariant mode bit-identical to the f32 weights.
TEST(GroupedBf16Test, MatchesF32WeightsOfTheSameValues) {
  std::mt19937 rng(2024);
  const int64_t d = 67, inter = 45;
  const std::vector<int32_t> rows_per_expert = {5, 0, 17, 1, 0, 9, 40};
  const int64_t ne = static_cast<int64_t>(rows_per_expert.size());
  Tensor offsets = Tensor::empty({ne + 1}, DType::kI32);
  offsets.data<int32_t>()[0] = 0;
  for (int64_t e = 0; e < ne; ++e)
    offsets.data<int32_t>()[e + 1] = offsets.data<int32_t>()[e] + rows_per_expert[e];
  const int64_t r = offsets.data<int32_t>()[ne];
  Tensor x = random_tensor({r, d}, rng, -1, 1);
  const Bf16Experts w = random_bf16_experts(ne, inter, d, rng);
  for (bool invariant : {false, true}) {
    Exec ex;
    ex.batch_invariant = invariant;
    Tensor y16 = Tensor::full({r, d}, kNaN), y32 = Tensor::full({r, d}, kNaN);
    moe_grouped_swiglu(ex, x, offsets, w.gate, w.up, w.down, y16);
    moe_grouped_swiglu(ex, x, offsets, w.f32.gate, w.f32.up, w.f32.down, y32);
    double err = 0.0, diff = 0.0;
    int64_t differ = 0;
    for (int64_t e = 0; e < ne; ++e) {
      for (int64_t row = offsets.data<int32_t>()[e]; row < offsets.data<int32_t>()[e + 1]; ++row) {
        const std::vector<double> want = expert_ref(w.f32, e, x.data<float>() + row * d);
        for (int64_t b = 0; b < d; ++b) {
          err = std::max(err, std::abs(y16.at<float>({row, b}) - want[b]));
          diff =
              std::max(diff, std::abs(double(y16.at<float>({row, b})) - y32.at<float>({row, b})));
        }
        // 2 to 8 rows: the few-row kernel for both dtypes (one row is sgemv for f32 weights).
        const bool few_rows = rows_per_expert[e] >= 2 && rows_per_expert[e] <= 8;
        if (invariant || few_rows)
          differ += !rows_equal(y16.data<float>() + row * d, y32.data<float>() + row * d, d);
      }
    }
    std::printf("grouped swiglu bf16 weights (invariant %d): max abs err %.3g, vs f32 %.3g\n",
                invariant, err, diff);
    EXPECT_LT(err, 2e-6);  // GroupedTest's bound
    EXPECT_LT(diff, 2e-6);
    EXPECT_EQ(differ, 0) << "rows differing from the f32 weights where the kernel is the same";
  }
}

TEST(ExpertsDeathTest, MixedWeightDtypesAbort) {
  Tensor x = Tensor::zeros({3, 4}), y = Tensor::empty({3, 4});
  Tensor wg = Tensor::zeros({1, 5, 4}), wu = Tensor::empty({1, 5, 4}, DType::kBF16),
         wd = Tensor::zeros({1, 4, 5});
  Tensor offsets = Tensor::empty({2}, DType::kI32);
  offsets.data<int32_t>()[0] = 0;
  offsets.data<int32_t>()[1] = 3;
  EXPECT_DEATH(moe_grouped_swiglu(host_exec(), x, offsets, wg, wu, wd, y), "all one dtype");
}

// A LocalExpertDispatcher over a sub-range (the dispatcher of a model loaded with
// Placement::experts): dispatch keeps only the slots of its experts (offsets per owned expert,
// row -1 for the others), the grouped GEMMs run on those rows with the owned weights only, and
// combine gives each token the sum over its owned choices (zeros with none). The shares of ranges
// covering every expert add up to the whole layer.
TEST(ExpertRangeTest, SubRangeDispatcherComputesItsShare) {
  const int64_t t = 29, d = 20, inter = 13, e = 6, k = 2;
  std::mt19937 rng(99);
  Tensor x = random_tensor({t, d}, rng, -1, 1);
  const Experts w = random_experts(e, inter, d, rng);
  Tensor ids = random_choices(t, k, e, true, rng);
  Tensor wts = random_tensor({t, k}, rng, 0.0f, 1.0f);
  Workspace ws(Device::kCpu);
  Exec ex;
  ex.workspace = &ws;
  const Tensor whole = run_local_layer(ex, x, ids, wts, w);
  std::vector<double> sum(t * d, 0.0);
  for (const ExpertRange r : {ExpertRange{0, 2}, ExpertRange{2, 5}, ExpertRange{5, 6}}) {
    LocalExpertDispatcher dispatcher(e, r);
    ASSERT_EQ(dispatcher.owned(), r);
    const Experts shard = w.range(r.begin, r.count());
    const Workspace::Mark scope(ws);
    const Dispatched dd = dispatcher.dispatch(ex, x, ids, wts, ws);
    ASSERT_EQ(dd.offsets.dim(0), r.count() + 1);
    int64_t owned_slots = 0;
    for (int64_t j = 0; j < t * k; ++j) {
      const bool mine = r.contains(ids.data<int32_t>()[j]);
      owned_slots += mine;
      ASSERT_EQ(dd.row_of_slot.data<int32_t>()[j] >= 0, mine) << "slot " << j;
    }
    ASSERT_EQ(dd.offsets.data<int32_t>()[r.count()], owned_slots);
    Tensor y = ws.take(dd.rows.shape());
    moe_grouped_swiglu(ex, dd.rows, dd.offsets, shard.gate, shard.up, shard.down, y);
    Tensor part = Tensor::full({t, d}, kNaN);
    dispatcher.combine(ex, y, dd, part);
    EXPECT_LT(max_abs_diff(part, layer_ref(x, ids, wts, w, r.begin, r.count())), 3e-6);
    for (int64_t i = 0; i < t * d; ++i) sum[i] += part.data<float>()[i];
  }
  EXPECT_LT(max_abs_diff(whole, sum), 2e-6);
}

TEST(ExpertsDeathTest, DispatcherRangeOutsideTheExpertsAborts) {
  EXPECT_DEATH(LocalExpertDispatcher(4, ExpertRange{2, 5}), "experts");
  EXPECT_DEATH(LocalExpertDispatcher(4, ExpertRange{2, 2}), "experts");
}

TEST(ExpertsDeathTest, BadExpertIdAborts) {
  Tensor x = Tensor::zeros({2, 4});
  Tensor ids = Tensor::empty({2, 1}, DType::kI32);
  ids.data<int32_t>()[0] = 0;
  ids.data<int32_t>()[1] = 3;
  Tensor offsets = Tensor::empty({4}, DType::kI32), rows = Tensor::empty({2, 1}, DType::kI32);
  Tensor xs = Tensor::empty({2, 4});
  EXPECT_DEATH(moe_permute(host_exec(), x, ids, 0, 3, offsets, rows, xs), "outside");
}

// combine's addend must be contiguous, of out's shape and dtype, and not out itself.
TEST(ExpertsDeathTest, BadCombineAddendAborts) {
  const Tensor y = Tensor::zeros({2, 4}), wts = Tensor::zeros({2, 1});
  Tensor rows = Tensor::empty({2, 1}, DType::kI32);
  rows.data<int32_t>()[0] = 0;
  rows.data<int32_t>()[1] = 1;
  Tensor out = Tensor::zeros({2, 4});
  EXPECT_DEATH(moe_unpermute_combine(host_exec(), y, rows, wts, out, out), "addend aliases out");
  EXPECT_DEATH(moe_unpermute_combine(host_exec(), y, rows, wts, out, Tensor::zeros({2, 3})),
               "addend .* must be contiguous, of out's shape and dtype");
  const Tensor wide = Tensor::zeros({2, 8});
  EXPECT_DEATH(moe_unpermute_combine(host_exec(), y, rows, wts, out, wide.slice(1, 0, 4)),
               "addend .* must be contiguous");
}

TEST(ExpertsDeathTest, OffsetsPastTheRowsAbort) {
  Tensor x = Tensor::zeros({3, 4}), y = Tensor::empty({3, 4});
  Tensor wg = Tensor::zeros({2, 5, 4}), wu = Tensor::zeros({2, 5, 4}),
         wd = Tensor::zeros({2, 4, 5});
  Tensor offsets = Tensor::empty({3}, DType::kI32);
  offsets.data<int32_t>()[0] = 0;
  offsets.data<int32_t>()[1] = 2;
  offsets.data<int32_t>()[2] = 4;
  EXPECT_DEATH(moe_grouped_swiglu(host_exec(), x, offsets, wg, wu, wd, y), "offsets");
}

}  // namespace
}  // namespace loom
