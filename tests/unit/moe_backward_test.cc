// The MoE backward ops (kernels/moe.h: moe_route_backward, moe_permute_backward,
// moe_grouped_swiglu_backward, moe_unpermute_combine_backward, and the load-balancing loss
// moe_aux_loss_forward_backward) against central differences of double-precision forwards
// (tests/unit/gradcheck_support.h describes the method), and MoeFfn::backward through
// Model::loss_and_gradients (with and without the load-balancing loss) against central differences
// of the f32 loss along the gradient.
//
// Routing is piecewise constant: a difference across a change of selection (or of the order of the
// chosen experts, which decides which gate weight meets which output) measures a jump, not a
// derivative. The router cases draw each row's logits until every selection decision (group kept
// or dropped, each chosen rank, the first expert left out) has a gap of at least 2e-3 in selection
// score; a step of h = 1e-5 moves a score by at most 2.5e-6 (sigmoid) or 1e-5 (softmax). The model
// checks compare every MoE layer's expert ids at +h and -h with the unmoved model's.
//
// Kernel bounds. Every op is a few f32 operations per element on O(1) data: the router's gradient
// is ~15 roundings deep (exp, the division of the renormalisation, two K-term sums, the softmax
// Jacobian's E-term sum), the expert weights' gradients are GEMMs over at most 13 rows of 7-wide or
// 5-wide products, the combine's are a single product or a double-accumulated dot. ~20 u = 1.2e-6
// worst case per element, far less in relative L2; 1e-5 holds them with room (measured worst
// 2.2e-7, the softmax router with groups; printed), while a wrong or missing term is off by 1e-2 or
// more.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/workspace.h"
#include "engine/model/model.h"
#include "engine/model/native_export.h"
#include "engine/parallel/local_expert_dispatcher.h"
#include "kernels/gemm.h"
#include "kernels/moe.h"
#include "tests/unit/engine_test_support.h"
#include "tests/unit/gradcheck_support.h"
#include "weights/model_config.h"
#include "weights/weight_loader.h"

namespace loom::gradcheck {
namespace {

constexpr double kGradTol = 1e-5;
constexpr double kForwardTol = 1e-6;
constexpr double kMinRoutingGap = 2e-3;

// ---------------------------------------------------------------------------------------------
// moe_route_backward

struct RouteRef {
  std::vector<int32_t> ids;  // [T, K], by descending selection score
  std::vector<double> w;     // [T, K]
  double gap = HUGE_VAL;     // the smallest gap of selection score at a decision
};

// The router in double, written as MODELS.md states it: scores, selection scores s + bias, groups
// scored by their top-2 sum, top-k of the kept experts, gate weights from the unbiased scores.
RouteRef route_ref(const std::vector<double>& logits, const std::vector<double>& bias, int64_t t,
                   int e, const RouterParams& p) {
  RouteRef out;
  const bool sigmoid = p.score == RouterScore::kSigmoid;
  const int ng = p.n_group, kg = p.topk_group, k = p.top_k, gs = e / ng;
  auto by_desc = [](const std::vector<double>& v, std::vector<int> idx) {
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return v[a] > v[b]; });
    return idx;
  };
  for (int64_t row = 0; row < t; ++row) {
    const double* l = logits.data() + row * e;
    std::vector<double> s(e), c(e);
    if (sigmoid) {
      for (int j = 0; j < e; ++j) s[j] = 1.0 / (1.0 + std::exp(-l[j]));
    } else {
      const double mx = *std::max_element(l, l + e);
      double sum = 0;
      for (int j = 0; j < e; ++j) sum += (s[j] = std::exp(l[j] - mx));
      for (int j = 0; j < e; ++j) s[j] /= sum;
    }
    for (int j = 0; j < e; ++j) c[j] = s[j] + (bias.empty() ? 0.0 : bias[j]);
    std::vector<int> candidates;
    if (ng > 1 && kg < ng) {
      std::vector<double> gscore(ng);
      for (int g = 0; g < ng; ++g) {
        std::vector<double> v(c.begin() + g * gs, c.begin() + (g + 1) * gs);
        std::sort(v.begin(), v.end(), std::greater<>());
        gscore[g] = v[0] + v[1];
      }
      std::vector<int> groups(ng);
      std::iota(groups.begin(), groups.end(), 0);
      groups = by_desc(gscore, groups);
      out.gap = std::min(out.gap, gscore[groups[kg - 1]] - gscore[groups[kg]]);
      std::sort(groups.begin(), groups.begin() + kg);
      for (int i = 0; i < kg; ++i)
        for (int j = 0; j < gs; ++j) candidates.push_back(groups[i] * gs + j);
    } else {
      candidates.resize(e);
      std::iota(candidates.begin(), candidates.end(), 0);
    }
    const std::vector<int> order = by_desc(c, candidates);
    for (int i = 0; i < k && i + 1 < static_cast<int>(order.size()); ++i)
      out.gap = std::min(out.gap, c[order[i]] - c[order[i + 1]]);
    double sum = 0;
    for (int i = 0; i < k; ++i) sum += s[order[i]];
    const double denom = p.renormalize ? (sigmoid ? sum + 1e-20 : sum) : 1.0;
    for (int i = 0; i < k; ++i) {
      out.ids.push_back(order[i]);
      out.w.push_back(s[order[i]] / denom * p.routed_scaling);
    }
  }
  return out;
}

struct RouteCase {
  RouterScore score;
  bool renormalize;
  float scaling;
  int n_group, topk_group;
  bool bias;
  int64_t t;
  int e, k;
};

class RouteBackward : public ::testing::TestWithParam<RouteCase> {};

TEST_P(RouteBackward, MatchesFiniteDifferences) {
  const RouteCase c = GetParam();
  RouterParams p;
  p.score = c.score;
  p.top_k = c.k;
  p.n_group = c.n_group;
  p.topk_group = c.topk_group;
  p.renormalize = c.renormalize;
  p.routed_scaling = c.scaling;
  std::mt19937 rng(static_cast<unsigned>(c.t * 100 + c.e * 10 + c.k));
  Tensor bias =
      c.bias ? random_tensor({c.e}, rng, std::normal_distribution<float>(0.0f, 0.1f)) : Tensor();
  const std::vector<double> bd = c.bias ? to_double(bias) : std::vector<double>();
  // Each row: a shuffled ladder of logits 0.3 apart plus a little noise, drawn again until every
  // selection decision is at least kMinRoutingGap away.
  Tensor logits = Tensor::empty({c.t, c.e});
  std::uniform_real_distribution<float> noise(-0.05f, 0.05f);
  std::vector<int> perm(c.e);
  std::iota(perm.begin(), perm.end(), 0);
  for (int64_t row = 0; row < c.t; ++row) {
    float* l = logits.data<float>() + row * c.e;
    for (int attempt = 0;; ++attempt) {
      ASSERT_LT(attempt, 1000) << "no well-separated routing for row " << row;
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int j = 0; j < c.e; ++j) l[j] = 0.3f * (perm[j] - 0.5f * c.e) + noise(rng);
      if (route_ref(std::vector<double>(l, l + c.e), bd, 1, c.e, p).gap >= kMinRoutingGap) break;
    }
  }
  const Tensor r = random_tensor({c.t, c.k}, rng);
  std::vector<double> ld = to_double(logits);

  // The forward: the kernel's choice and weights are the reference's.
  Tensor ids = Tensor::empty({c.t, c.k}, DType::kI32), w = Tensor::empty({c.t, c.k});
  moe_route(host_exec(), logits, bias, p, ids, w);
  const RouteRef ref = route_ref(ld, bd, c.t, c.e, p);
  ASSERT_EQ(std::vector<int32_t>(ids.data<int32_t>(), ids.data<int32_t>() + c.t * c.k), ref.ids);
  expect_forward_close("moe_route weights", w, ref.w, kForwardTol);

  auto j = [&] {
    const RouteRef at = route_ref(ld, bd, c.t, c.e, p);
    EXPECT_EQ(at.ids, ref.ids) << "the routing changed under the perturbation";
    return project(at.w, r);
  };
  Tensor d_logits = Tensor::full({c.t, c.e}, NAN);
  moe_route_backward(host_exec(), logits, ids, p, r, d_logits);
  const std::vector<double> fd = central_diff(j, ld);
  expect_grad_close(c.score == RouterScore::kSigmoid ? "moe_route d_logits (sigmoid)"
                                                     : "moe_route d_logits (softmax)",
                    d_logits, fd, kGradTol);
  if (c.score == RouterScore::kSigmoid) {
    // Only the chosen experts' logits carry gradient; the others get exact zeros.
    for (int64_t row = 0; row < c.t; ++row)
      for (int x = 0; x < c.e; ++x) {
        const int32_t* id = ids.data<int32_t>() + row * c.k;
        if (std::find(id, id + c.k, x) == id + c.k) {
          ASSERT_EQ(d_logits.data<float>()[row * c.e + x], 0.0f) << row << " " << x;
        }
      }
  }
  // d_logits may be the logits themselves: the same bits.
  Tensor alias = logits.clone();
  moe_route_backward(host_exec(), alias, ids, p, r, alias);
  EXPECT_EQ(std::memcmp(alias.raw(), d_logits.raw(), d_logits.nbytes()), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, RouteBackward,
    ::testing::Values(
        // kimi_linear / deepseek_v3: sigmoid, bias, groups, renormalised, scaled.
        RouteCase{RouterScore::kSigmoid, true, 2.446f, 3, 2, true, 7, 9, 3},
        RouteCase{RouterScore::kSigmoid, true, 2.446f, 2, 1, true, 9, 12, 3},
        RouteCase{RouterScore::kSigmoid, false, 1.0f, 1, 1, false, 7, 9, 3},
        RouteCase{RouterScore::kSigmoid, false, 1.5f, 1, 1, true, 5, 11, 1},
        // qwen3_next: softmax over every expert, renormalised or not.
        RouteCase{RouterScore::kSoftmax, true, 1.0f, 1, 1, false, 6, 10, 4},
        RouteCase{RouterScore::kSoftmax, false, 2.0f, 1, 1, false, 7, 9, 2},
        RouteCase{RouterScore::kSoftmax, true, 1.5f, 3, 1, true, 5, 9, 2}));

// K = 1 renormalised: the gate weight is routed_scaling whatever the logits (s / (s + 1e-20)
// rounds to 1), so the logits get no gradient at all.
TEST(RouteBackward, SingleRenormalisedChoiceHasNoGradient) {
  std::mt19937 rng(3);
  RouterParams p;
  p.top_k = 1;
  p.routed_scaling = 2.5f;
  for (RouterScore score : {RouterScore::kSigmoid, RouterScore::kSoftmax}) {
    p.score = score;
    const Tensor logits = random_tensor({5, 7}, rng), r = random_tensor({5, 1}, rng);
    Tensor ids = Tensor::empty({5, 1}, DType::kI32), w = Tensor::empty({5, 1});
    moe_route(host_exec(), logits, Tensor(), p, ids, w);
    Tensor d_logits = Tensor::full({5, 7}, NAN);
    moe_route_backward(host_exec(), logits, ids, p, r, d_logits);
    for (int64_t i = 0; i < d_logits.numel(); ++i)
      EXPECT_NEAR(d_logits.data<float>()[i], 0.0f, 1e-6f) << i;
  }
}

// ---------------------------------------------------------------------------------------------
// moe_permute_backward and moe_unpermute_combine_backward

// Distinct experts per token, as a router chooses them.
Tensor random_expert_ids(int64_t t, int64_t k, int64_t e, std::mt19937& rng) {
  Tensor ids = Tensor::empty({t, k}, DType::kI32);
  std::vector<int32_t> all(e);
  std::iota(all.begin(), all.end(), 0);
  for (int64_t i = 0; i < t; ++i) {
    std::shuffle(all.begin(), all.end(), rng);
    std::copy(all.begin(), all.begin() + k, ids.data<int32_t>() + i * k);
  }
  return ids;
}

struct Permuted {
  Tensor offsets, row_of_slot, x_sorted;
  int64_t kept = 0;
};

Permuted permute(const Tensor& x, const Tensor& ids, ExpertRange owned, int64_t e) {
  Permuted p;
  p.offsets = Tensor::empty({owned.count() + 1}, DType::kI32);
  p.row_of_slot = Tensor::empty(ids.shape(), DType::kI32);
  p.x_sorted = Tensor::full({ids.numel() + 2, x.dim(1)}, NAN);  // two rows more than can be kept
  moe_permute(host_exec(), x, ids, owned.begin, e, p.offsets, p.row_of_slot, p.x_sorted);
  p.kept = p.offsets.data<int32_t>()[owned.count()];
  return p;
}

struct RangeCase {
  int64_t t, k, d, e;
  ExpertRange owned;
};

class SlotBackward : public ::testing::TestWithParam<RangeCase> {};

TEST_P(SlotBackward, PermuteMatchesFiniteDifferences) {
  const RangeCase c = GetParam();
  std::mt19937 rng(static_cast<unsigned>(c.t * 10 + c.owned.begin));
  const Tensor x = random_tensor({c.t, c.d}, rng);
  const Tensor ids = random_expert_ids(c.t, c.k, c.e, rng);
  const Permuted p = permute(x, ids, c.owned, c.e);
  ASSERT_GT(p.kept, 0);
  const Tensor r = random_tensor({p.x_sorted.dim(0), c.d}, rng);
  std::vector<double> xd = to_double(x);
  const int32_t* rows = p.row_of_slot.data<int32_t>();
  auto j = [&] {  // sum over the kept rows of x_sorted * r, x_sorted[row_of_slot[t, i]] = x[t]
    double s = 0;
    for (int64_t slot = 0; slot < c.t * c.k; ++slot) {
      if (rows[slot] < 0) continue;
      for (int64_t col = 0; col < c.d; ++col)
        s += xd[(slot / c.k) * c.d + col] * r.data<float>()[rows[slot] * c.d + col];
    }
    return s;
  };
  Tensor dx = Tensor::zeros({c.t, c.d});
  moe_permute_backward(host_exec(), r, p.row_of_slot, dx);
  expect_grad_close("moe_permute d_x", dx, central_diff(j, xd), kGradTol);
  // Accumulated: one finished sum added per element.
  const Tensor base = random_tensor({c.t, c.d}, rng);
  Tensor after = base.clone();
  moe_permute_backward(host_exec(), r, p.row_of_slot, after);
  expect_accumulated("moe_permute d_x", base, dx, after);
}

TEST_P(SlotBackward, CombineMatchesFiniteDifferences) {
  const RangeCase c = GetParam();
  std::mt19937 rng(static_cast<unsigned>(c.t * 20 + c.owned.begin));
  const Tensor ids = random_expert_ids(c.t, c.k, c.e, rng);
  const Permuted p = permute(random_tensor({c.t, c.d}, rng), ids, c.owned, c.e);
  const int64_t rows_total = p.x_sorted.dim(0);
  const Tensor y = random_tensor({rows_total, c.d}, rng);
  const Tensor weights = random_tensor({c.t, c.k}, rng, 0.1f, 1.0f);
  const Tensor r = random_tensor({c.t, c.d}, rng);
  std::vector<double> yd = to_double(y), wd = to_double(weights);
  const int32_t* rows = p.row_of_slot.data<int32_t>();
  auto j = [&] {  // sum(out * r), out[t] = sum_i w[t, i] * y[row_of_slot[t, i]]
    double s = 0;
    for (int64_t slot = 0; slot < c.t * c.k; ++slot) {
      if (rows[slot] < 0) continue;
      for (int64_t col = 0; col < c.d; ++col)
        s += wd[slot] * yd[rows[slot] * c.d + col] * r.data<float>()[(slot / c.k) * c.d + col];
    }
    return s;
  };
  // The forward is the kernel's.
  Tensor out = Tensor::empty({c.t, c.d});
  moe_unpermute_combine(host_exec(), y, p.row_of_slot, weights, out);
  Tensor d_y = Tensor::full({rows_total, c.d}, 7.0f), d_w = Tensor::full({c.t, c.k}, NAN);
  moe_unpermute_combine_backward(host_exec(), y, p.row_of_slot, weights, r, d_y, d_w);
  // d_y: the kept rows against the differences; the rows no slot names are untouched.
  const std::vector<double> fd_y = central_diff(j, yd);
  expect_grad_close("moe_unpermute_combine d_y", d_y.slice(0, 0, p.kept).clone(),
                    std::vector<double>(fd_y.begin(), fd_y.begin() + p.kept * c.d), kGradTol);
  for (int64_t i = p.kept * c.d; i < d_y.numel(); ++i) ASSERT_EQ(d_y.data<float>()[i], 7.0f) << i;
  const std::vector<double> fd_w = central_diff(j, wd);
  expect_grad_close("moe_unpermute_combine d_weights", d_w, fd_w, kGradTol);
  for (int64_t slot = 0; slot < c.t * c.k; ++slot)
    if (rows[slot] < 0) {
      ASSERT_EQ(d_w.data<float>()[slot], 0.0f) << slot;
    }
}

INSTANTIATE_TEST_SUITE_P(Cases, SlotBackward,
                         ::testing::Values(RangeCase{11, 3, 5, 7, {0, 7}},   // every expert
                                           RangeCase{11, 3, 5, 7, {2, 5}},   // a rank's share
                                           RangeCase{13, 2, 9, 5, {4, 5}},   // one expert
                                           RangeCase{3, 4, 7, 6, {0, 6}}));  // K > T

// A LocalExpertDispatcher over a sub-range: its backward is the two ops, and the shares of ranks
// covering every expert sum to the whole dispatcher's gradients (d_x and d_weights).
TEST(SlotBackward, DispatcherSharesSumToTheWhole) {
  std::mt19937 rng(12);
  const int64_t t = 9, k = 3, d = 6, e = 8;
  const Tensor x = random_tensor({t, d}, rng), d_out = random_tensor({t, d}, rng);
  const Tensor ids = random_expert_ids(t, k, e, rng);
  const Tensor weights = random_tensor({t, k}, rng, 0.1f, 1.0f);
  Workspace ws(Device::kCpu);
  // The expert output of a row: any function of it (here 2 x + 1); its gradient d_rows is d_y.
  auto run = [&](ExpertRange owned, Tensor& d_x, Tensor& d_w) {
    const Workspace::Mark scope(ws);
    LocalExpertDispatcher dispatcher(e, owned);
    const Dispatched dd = dispatcher.dispatch(host_exec(), x, ids, weights, ws);
    Tensor y = Tensor::empty(dd.rows.shape()), d_y = Tensor::zeros(dd.rows.shape());
    for (int64_t i = 0; i < y.numel(); ++i) y.data<float>()[i] = 2 * dd.rows.data<float>()[i] + 1;
    dispatcher.combine_backward(host_exec(), y, dd, d_out, d_y, d_w);
    dispatcher.dispatch_backward(host_exec(), d_y, dd, d_x);
  };
  Tensor whole_x = Tensor::zeros({t, d}), whole_w = Tensor::empty({t, k});
  run({0, e}, whole_x, whole_w);
  Tensor sum_x = Tensor::zeros({t, d}), sum_w = Tensor::zeros({t, k});
  for (ExpertRange share : {ExpertRange{0, 3}, ExpertRange{3, 4}, ExpertRange{4, 8}}) {
    Tensor d_w = Tensor::empty({t, k});
    run(share, sum_x, d_w);  // d_x accumulates over the shares
    for (int64_t i = 0; i < d_w.numel(); ++i) sum_w.data<float>()[i] += d_w.data<float>()[i];
  }
  // Each slot's d_weights comes from exactly one share: the same bits.
  EXPECT_EQ(std::memcmp(sum_w.raw(), whole_w.raw(), whole_w.nbytes()), 0);
  // d_x sums a token's slots in another grouping: equal within rounding.
  for (int64_t i = 0; i < whole_x.numel(); ++i)
    EXPECT_NEAR(sum_x.data<float>()[i], whole_x.data<float>()[i],
                1e-6f * (1 + std::fabs(whole_x.data<float>()[i])))
        << i;
}

TEST(SlotBackwardDeathTest, RejectBadRowsBeforeWriting) {
  Tensor rows = Tensor::empty({2, 2}, DType::kI32);
  const int32_t r[] = {0, 1, 1, -1};
  std::copy(r, r + 4, rows.data<int32_t>());
  const Tensor y = Tensor::zeros({3, 4}), w = Tensor::zeros({2, 2}), g = Tensor::zeros({2, 4});
  Tensor d_y = Tensor::zeros({3, 4}), d_w = Tensor::zeros({2, 2});
  EXPECT_DEATH(moe_unpermute_combine_backward(host_exec(), y, rows, w, g, d_y, d_w), "two slots");
  rows.data<int32_t>()[1] = 3;  // past the 3 rows of y
  Tensor d_x = Tensor::zeros({2, 4});
  EXPECT_DEATH(moe_permute_backward(host_exec(), y, rows, d_x), "row_of_slot");
}

// ---------------------------------------------------------------------------------------------
// moe_grouped_swiglu_backward

struct Experts {
  Tensor gate, up, down;
};

// y (and, in gate_up if given, the pre-activations [2, R, I]) for the rows of each expert.
std::vector<double> swiglu_ref(const std::vector<double>& x, const std::vector<double>& wg,
                               const std::vector<double>& wu, const std::vector<double>& wdn,
                               const std::vector<int32_t>& off, int64_t r, int64_t d, int64_t in,
                               std::vector<double>* gate_up = nullptr) {
  const int64_t ne = static_cast<int64_t>(off.size()) - 1;
  std::vector<double> y(r * d, 0.0);
  if (gate_up) gate_up->assign(2 * r * in, 0.0);
  std::vector<double> h(in);
  for (int64_t e = 0; e < ne; ++e) {
    for (int64_t row = off[e]; row < off[e + 1]; ++row) {
      for (int64_t i = 0; i < in; ++i) {
        double g = 0, u = 0;
        for (int64_t c = 0; c < d; ++c) {
          g += wg[(e * in + i) * d + c] * x[row * d + c];
          u += wu[(e * in + i) * d + c] * x[row * d + c];
        }
        if (gate_up) {
          (*gate_up)[row * in + i] = g;
          (*gate_up)[(r + row) * in + i] = u;
        }
        h[i] = g / (1.0 + std::exp(-g)) * u;
      }
      for (int64_t c = 0; c < d; ++c) {
        double acc = 0;
        for (int64_t i = 0; i < in; ++i) acc += wdn[(e * d + c) * in + i] * h[i];
        y[row * d + c] = acc;
      }
    }
  }
  return y;
}

TEST(GroupedSwigluBackward, MatchesFiniteDifferences) {
  // Three experts, the middle one with no rows; rows 13 .. 15 belong to no expert.
  const int64_t r = 16, d = 7, in = 5, ne = 3;
  const std::vector<int32_t> off = {0, 6, 6, 13};
  const int64_t kept = off.back();
  std::mt19937 rng(21);
  const Tensor x = random_tensor({r, d}, rng);
  Experts w{random_tensor({ne, in, d}, rng), random_tensor({ne, in, d}, rng),
            random_tensor({ne, d, in}, rng)};
  Tensor offsets = Tensor::empty({ne + 1}, DType::kI32);
  std::copy(off.begin(), off.end(), offsets.data<int32_t>());
  const Tensor dy = random_tensor({r, d}, rng);
  std::vector<double> xd = to_double(x), gd = to_double(w.gate), ud = to_double(w.up),
                      dd = to_double(w.down);

  // The forward, with and without the kept pre-activations: the same y, and the pre-activations
  // are the reference's.
  Tensor y = Tensor::full({r, d}, 7.0f), y_kept = Tensor::full({r, d}, 7.0f);
  Tensor gate_up = Tensor::full({2, r, in}, 7.0f);
  moe_grouped_swiglu(host_exec(), x, offsets, w.gate, w.up, w.down, y);
  moe_grouped_swiglu(host_exec(), x, offsets, w.gate, w.up, w.down, y_kept, gate_up);
  EXPECT_EQ(std::memcmp(y.raw(), y_kept.raw(), y.nbytes()), 0);
  std::vector<double> gu_ref;
  const std::vector<double> y_ref = swiglu_ref(xd, gd, ud, dd, off, r, d, in, &gu_ref);
  expect_forward_close("moe_grouped_swiglu y", y.slice(0, 0, kept).clone(),
                       std::vector<double>(y_ref.begin(), y_ref.begin() + kept * d), kForwardTol);
  for (int plane = 0; plane < 2; ++plane) {
    const Tensor got = gate_up.select(plane).slice(0, 0, kept).clone();
    const auto from = gu_ref.begin() + plane * r * in;
    expect_forward_close(plane == 0 ? "moe_grouped_swiglu gate" : "moe_grouped_swiglu up", got,
                         std::vector<double>(from, from + kept * in), kForwardTol);
    for (int64_t i = kept * in; i < r * in; ++i)
      ASSERT_EQ(gate_up.select(plane).data<float>()[i], 7.0f) << "gate_up past the rows, " << i;
  }

  auto j = [&] {
    const std::vector<double> yy = swiglu_ref(xd, gd, ud, dd, off, r, d, in);
    return project(yy, dy);  // rows past `kept` are zeros in yy
  };
  const std::vector<double> fd_x = central_diff(j, xd), fd_g = central_diff(j, gd),
                            fd_u = central_diff(j, ud), fd_d = central_diff(j, dd);
  for (const bool keep : {true, false}) {
    Tensor dx = Tensor::full({r, d}, 7.0f);
    Tensor dwg = Tensor::zeros(w.gate.shape()), dwu = Tensor::zeros(w.up.shape()),
           dwd = Tensor::zeros(w.down.shape());
    moe_grouped_swiglu_backward(host_exec(), x, offsets, w.gate, w.up, w.down,
                                keep ? gate_up : Tensor(), dy, dx, dwg, dwu, dwd);
    std::printf("[gradcheck] pre-activations %s\n", keep ? "kept" : "recomputed");
    expect_grad_close("moe_grouped_swiglu d_x", dx.slice(0, 0, kept).clone(),
                      std::vector<double>(fd_x.begin(), fd_x.begin() + kept * d), kGradTol);
    for (int64_t i = kept * d; i < r * d; ++i)
      ASSERT_EQ(dx.data<float>()[i], 7.0f) << "d_x past the rows, " << i;
    expect_grad_close("moe_grouped_swiglu d_w_gate", dwg, fd_g, kGradTol);
    expect_grad_close("moe_grouped_swiglu d_w_up", dwu, fd_u, kGradTol);
    expect_grad_close("moe_grouped_swiglu d_w_down", dwd, fd_d, kGradTol);
    // The empty expert's weights get exact zeros.
    for (const Tensor* g : {&dwg, &dwu, &dwd})
      for (int64_t i = 0; i < in * d; ++i) ASSERT_EQ(g->select(1).data<float>()[i], 0.0f);

    // The weight gradients accumulate onto what they held (one GEMM with beta = 1 over at most
    // 13 rows: a single block, so one finished sum is added per element).
    const Tensor bg = random_tensor(w.gate.shape(), rng), bu = random_tensor(w.up.shape(), rng),
                 bd = random_tensor(w.down.shape(), rng);
    Tensor ag = bg.clone(), au = bu.clone(), ad = bd.clone(), dx2 = Tensor::empty({r, d});
    moe_grouped_swiglu_backward(host_exec(), x, offsets, w.gate, w.up, w.down,
                                keep ? gate_up : Tensor(), dy, dx2, ag, au, ad);
    expect_accumulated("moe_grouped_swiglu d_w_gate", bg, dwg, ag);
    expect_accumulated("moe_grouped_swiglu d_w_up", bu, dwu, au);
    expect_accumulated("moe_grouped_swiglu d_w_down", bd, dwd, ad);
  }
}

TEST(GroupedSwigluBackwardDeathTest, Bf16WeightsAbortNamingF32) {
  const int64_t r = 4, d = 6, in = 3, ne = 2;
  Tensor offsets = Tensor::empty({ne + 1}, DType::kI32);
  const int32_t off[] = {0, 2, 4};
  std::copy(off, off + 3, offsets.data<int32_t>());
  const Tensor x = Tensor::zeros({r, d}), dy = Tensor::zeros({r, d});
  const Tensor wg = Tensor::zeros({ne, in, d}, DType::kBF16),
               wu = Tensor::zeros({ne, in, d}, DType::kBF16),
               wd = Tensor::zeros({ne, d, in}, DType::kBF16);
  Tensor dx = Tensor::zeros({r, d}), dwg = Tensor::zeros({ne, in, d}),
         dwu = Tensor::zeros({ne, in, d}), dwd = Tensor::zeros({ne, d, in});
  EXPECT_DEATH(moe_grouped_swiglu_backward(host_exec(), x, offsets, wg, wu, wd, Tensor(), dy, dx,
                                           dwg, dwu, dwd),
               "training needs f32 expert weights");
}

// ---------------------------------------------------------------------------------------------
// Thread counts

// ---------------------------------------------------------------------------------------------
// moe_aux_loss_forward_backward

// alpha * E * sum_e f_e * P_e in double, as kernels/moe.h states it: f from the ids (constant),
// P the mean over rows of the scores normalised over the experts.
double aux_loss_ref(const std::vector<double>& logits, const Tensor& ids, int64_t t, int e,
                    RouterScore score, double alpha) {
  std::vector<double> count(e, 0.0), mass(e, 0.0);
  for (int64_t i = 0; i < ids.numel(); ++i) count[ids.data<int32_t>()[i]] += 1;
  for (int64_t row = 0; row < t; ++row) {
    const double* l = logits.data() + row * e;
    std::vector<double> p(e);
    double sum = 0;
    if (score == RouterScore::kSigmoid) {
      for (int j = 0; j < e; ++j) sum += (p[j] = 1.0 / (1.0 + std::exp(-l[j])));
    } else {
      const double mx = *std::max_element(l, l + e);
      for (int j = 0; j < e; ++j) sum += (p[j] = std::exp(l[j] - mx));
    }
    for (int j = 0; j < e; ++j) mass[j] += p[j] / sum;
  }
  double loss = 0;
  for (int j = 0; j < e; ++j)
    loss += count[j] / static_cast<double>(ids.numel()) * (mass[j] / static_cast<double>(t));
  return alpha * e * loss;
}

struct AuxCase {
  RouterScore score;
  int64_t t;
  int e, k;
  float alpha;
};

class AuxLossBackward : public ::testing::TestWithParam<AuxCase> {};

// The loss and its gradient (added onto what d_logits holds) against the double reference and its
// central differences. The routing is the f32 router's on logits with a ramp across the experts,
// so the load is uneven: with an even load c_e is one constant and the gradient vanishes
// (sum_e p_e = 1), which would make the check empty. The bound is kGradTol's reasoning: a softmax
// or sigmoid, one E-term sum and a product per element.
TEST_P(AuxLossBackward, MatchesFiniteDifferences) {
  const AuxCase c = GetParam();
  std::mt19937 rng(static_cast<unsigned>(c.t * 31 + c.e));
  Tensor logits = random_tensor({c.t, c.e}, rng, -1.5f, 1.5f);
  for (int64_t row = 0; row < c.t; ++row)
    for (int j = 0; j < c.e; ++j) logits.data<float>()[row * c.e + j] += 0.3f * (c.e - j);
  RouterParams p;
  p.score = c.score;
  p.top_k = c.k;
  Tensor ids = Tensor::empty({c.t, c.k}, DType::kI32), w = Tensor::empty({c.t, c.k});
  moe_route(host_exec(), logits, Tensor(), p, ids, w);
  std::vector<double> ld = to_double(logits);
  const double want = aux_loss_ref(ld, ids, c.t, c.e, c.score, c.alpha);

  Tensor loss = Tensor::full({1}, NAN), d_logits = Tensor::zeros({c.t, c.e});
  moe_aux_loss_forward_backward(host_exec(), logits, ids, c.score, c.alpha, loss, d_logits);
  std::printf("[gradcheck] aux loss %.9g, reference %.9g\n", loss.data<float>()[0], want);
  EXPECT_NEAR(loss.data<float>()[0], want, 1e-6 * want);
  const std::vector<double> fd =
      central_diff([&] { return aux_loss_ref(ld, ids, c.t, c.e, c.score, c.alpha); }, ld);
  expect_grad_close(c.score == RouterScore::kSigmoid ? "moe_aux_loss d_logits (sigmoid)"
                                                     : "moe_aux_loss d_logits (softmax)",
                    d_logits, fd, kGradTol);
  // Added onto d_logits: one finished sum per element, exactly base + the gradient.
  const Tensor base = random_tensor({c.t, c.e}, rng);
  Tensor onto = base.clone();
  moe_aux_loss_forward_backward(host_exec(), logits, ids, c.score, c.alpha, loss, onto);
  expect_accumulated("moe_aux_loss d_logits", base, d_logits, onto);
}

INSTANTIATE_TEST_SUITE_P(Cases, AuxLossBackward,
                         ::testing::Values(AuxCase{RouterScore::kSigmoid, 7, 9, 3, 0.5f},
                                           AuxCase{RouterScore::kSigmoid, 12, 16, 2, 1e-2f},
                                           AuxCase{RouterScore::kSoftmax, 7, 9, 3, 0.5f},
                                           AuxCase{RouterScore::kSoftmax, 5, 6, 1, 2.0f}));

// An even load gives L = alpha whatever the probabilities, and no gradient (the slots' share is
// the same 1 / E for every expert, and the probabilities sum to 1); all of the slots on one
// expert gives alpha * E * P_e.
TEST(AuxLossBackward, EvenAndConcentratedLoads) {
  std::mt19937 rng(8);
  const int64_t t = 6;
  const int e = 6, k = 2;
  const Tensor logits = random_tensor({t, e}, rng, -2.0f, 2.0f);
  Tensor even = Tensor::empty({t, k}, DType::kI32);
  for (int64_t i = 0; i < t * k; ++i) even.data<int32_t>()[i] = static_cast<int32_t>(i % e);
  for (RouterScore score : {RouterScore::kSigmoid, RouterScore::kSoftmax}) {
    Tensor loss = Tensor::empty({1}), d_logits = Tensor::zeros({t, e});
    moe_aux_loss_forward_backward(host_exec(), logits, even, score, 0.25f, loss, d_logits);
    EXPECT_NEAR(loss.data<float>()[0], 0.25f, 1e-7f);
    for (int64_t i = 0; i < d_logits.numel(); ++i)
      EXPECT_NEAR(d_logits.data<float>()[i], 0.0f, 1e-8f) << i;
    Tensor one = Tensor::zeros({t, 1}, DType::kI32);  // every slot on expert 0
    moe_aux_loss_forward_backward(host_exec(), logits, one, score, 0.25f, loss,
                                  Tensor::zeros({t, e}));
    const double p0 = aux_loss_ref(to_double(logits), one, t, e, score, 1.0) / e;  // P_0
    EXPECT_NEAR(loss.data<float>()[0], 0.25 * e * p0, 1e-6);
  }
}

// The OpenMP ops (router, permute, combine and load-balancing loss backwards) give the same bits at
// any thread count
// (sizes above their parallel thresholds). The grouped GEMMs are OpenBLAS's: fixed bits at a fixed
// thread count only (docs/trainer.md).
TEST(MoeBackward, SameBitsForAnyThreadCount) {
  std::mt19937 rng(5);
  const int64_t t = 1500, e = 16, k = 4, d = 40;
  RouterParams p;
  p.top_k = static_cast<int>(k);
  p.n_group = 4;
  p.topk_group = 2;
  p.routed_scaling = 2.5f;
  const Tensor logits = random_tensor({t, e}, rng, -3.0f, 3.0f), bias = random_tensor({e}, rng);
  Tensor ids = Tensor::empty({t, k}, DType::kI32), w = Tensor::empty({t, k});
  moe_route(host_exec(), logits, bias, p, ids, w);
  const Tensor x = random_tensor({t, d}, rng), d_out = random_tensor({t, d}, rng);
  const Tensor dw = random_tensor({t, k}, rng);
  const Permuted perm = permute(x, ids, {0, e}, e);
  const Tensor y = random_tensor(perm.x_sorted.shape(), rng);
  RouterParams softmax = p;
  softmax.score = RouterScore::kSoftmax;
  expect_same_bits_for_any_thread_count([&](int) {
    Tensor d_logits = Tensor::empty({t, e}), d_soft = Tensor::empty({t, e});
    moe_route_backward(host_exec(), logits, ids, p, dw, d_logits);
    moe_route_backward(host_exec(), logits, ids, softmax, dw, d_soft);
    Tensor d_y = Tensor::zeros(y.shape()), d_w = Tensor::empty({t, k});
    moe_unpermute_combine_backward(host_exec(), y, perm.row_of_slot, w, d_out, d_y, d_w);
    Tensor d_x = Tensor::zeros({t, d});
    moe_permute_backward(host_exec(), d_y, perm.row_of_slot, d_x);
    Tensor aux = Tensor::empty({1}), aux_soft = Tensor::empty({1});
    moe_aux_loss_forward_backward(host_exec(), logits, ids, RouterScore::kSigmoid, 0.01f, aux,
                                  d_logits);
    moe_aux_loss_forward_backward(host_exec(), logits, ids, RouterScore::kSoftmax, 0.01f, aux_soft,
                                  d_soft);
    return std::vector<Tensor>{d_logits, d_soft, d_y, d_w, d_x, aux, aux_soft};
  });
}

}  // namespace
}  // namespace loom::gradcheck

// ---------------------------------------------------------------------------------------------
// MoeFfn::backward through Model::loss_and_gradients

namespace loom {
namespace {

// The expert ids of every MoE layer for `tokens` (concatenated, layer by layer): the model's
// forward with a tape of the FFN inputs, each layer's router (weights from `record`) run on them.
std::vector<int32_t> routing(const Model& model, const WeightLoader::Record& record,
                             std::span<const int32_t> tokens) {
  const ModelConfig& cfg = model.config();
  const int64_t n = static_cast<int64_t>(tokens.size());
  SequenceCache cache = model.new_cache();
  ForwardBatch batch;
  batch.token_ids.assign(tokens.begin(), tokens.end());
  batch.seqs.push_back({.num_tokens = n, .logits = LogitsMode::kNone, .cache = &cache});
  ActivationTape tape({"ffn_in"});
  EXPECT_TRUE(model.forward(batch, &tape).ok());
  auto find = [&](const std::string& name) {
    for (const auto& [key, t] : record)
      if (key == name) return t.to_f32();
    return Tensor();
  };
  RouterParams p;
  p.score = cfg.moe.score_sigmoid ? RouterScore::kSigmoid : RouterScore::kSoftmax;
  p.top_k = cfg.moe.top_k;
  p.n_group = cfg.moe.n_group;
  p.topk_group = cfg.moe.topk_group;
  p.renormalize = cfg.moe.renormalize;
  p.routed_scaling = cfg.moe.routed_scaling;
  std::vector<int32_t> all;
  for (int l = 0; l < cfg.num_layers; ++l) {
    if (cfg.ffns[l] != FfnType::kMoe) continue;
    const std::string prefix = "layers." + std::to_string(l) + ".moe.router.";
    const Tensor router = find(prefix + "weight");
    const Tensor bias = cfg.moe.has_score_bias ? find(prefix + "bias") : Tensor();
    Tensor logits = Tensor::empty({n, router.dim(0)});
    linear_forward(host_exec(), *tape.find(l, "ffn_in"), router, logits);
    Tensor ids = Tensor::empty({n, p.top_k}, DType::kI32), w = Tensor::empty({n, p.top_k});
    moe_route(host_exec(), logits, bias, p, ids, w);
    all.insert(all.end(), ids.data<int32_t>(), ids.data<int32_t>() + ids.numel());
  }
  return all;
}

struct Direction {
  const char* name;
  double h;  // the larger of the two steps (h and h / 3)
};

// The bound at step s is kModelGradTol * |g| + ulp(loss) / (2 s). The second term is exact: the
// loss is an f32 (ulp 4.8e-7 near its 6.2), so a central difference is a multiple of
// ulp / (2 s), and this term dominates the small steps that keep the routing fixed (measured:
// layers.1.moe.experts.up 5.3e-5 relative at s = 1e-3, 3.9e-4 at 3.3e-4, both within one such
// quantum, 1.7e-4 and 5.0e-4). kModelGradTol covers the truncation, measured to shrink as s^2
// (layers.1.moe.experts.gate: 1.7e-3 at s = 1e-2, 1.8e-4 at 3.3e-3, so <= 2e-5 at the steps it
// is checked at) and the f32 gradient's own rounding (up to 2.2e-4 in this model family,
// model_gradients_test.cc); every direction measured is within 4.8e-4 relative. A token whose
// experts change between +s and -s makes the difference meaningless (the flips measured at
// larger steps gave errors of 2.5e-2 to 9), hence the routing check and the small steps.
constexpr double kModelGradTol = 1e-3;

// The derivative of the loss along each named parameter's unit gradient, by central differences
// of the f32 loss at steps h and h / 3 (a native checkpoint of the synthetic weights with that
// tensor moved, loaded back), against the gradient's norm at both steps; every MoE layer's
// routing must be the unmoved model's at both ends of both steps.
// With `aux_alpha` > 0 the objective is the cross-entropy plus every MoE layer's load-balancing
// loss (Gradients::set_aux_loss_alpha), differentiated and differenced alike.
void check_directions(const ModelConfig& cfg, const char* tag, std::span<const Direction> dirs,
                      float aux_alpha = 0.0f) {
  auto model = Model::load(cfg, WeightLoader::synthetic(cfg, 5));
  ASSERT_TRUE(model.ok()) << model.status();
  std::mt19937 rng(2);
  std::uniform_int_distribution<int> tok(0, cfg.vocab_size - 1);
  std::vector<int32_t> tokens(29);
  for (int32_t& t : tokens) t = tok(rng);
  Gradients grads;
  grads.set_aux_loss_alpha(aux_alpha);
  auto ce = (*model)->loss_and_gradients(tokens, grads);
  ASSERT_TRUE(ce.ok()) << ce.status();
  const double aux = grads.aux_loss();
  EXPECT_EQ(aux > 0, aux_alpha > 0) << "aux loss " << aux;
  const double loss = *ce + aux;

  // The gradients' names and shapes: the experts as the weights hold them, no router bias.
  const int64_t e = cfg.moe.num_experts, in = cfg.moe.intermediate_size, d = cfg.hidden_size;
  for (int l = 0; l < cfg.num_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".moe.";
    if (cfg.ffns[l] != FfnType::kMoe) {
      EXPECT_EQ(grads.find(p + "router.weight"), nullptr);
      continue;
    }
    EXPECT_EQ(grads.find(p + "router.bias"), nullptr) << "the router bias has a gradient";
    const std::vector<std::pair<std::string, Shape>> want = {
        {"router.weight", Shape({e, d})},
        {"experts.gate", Shape({e, in, d})},
        {"experts.up", Shape({e, in, d})},
        {"experts.down", Shape({e, d, in})},
        {"shared.gate_proj.weight", Shape({cfg.moe.shared_intermediate_size, d})},
        {"shared.up_proj.weight", Shape({cfg.moe.shared_intermediate_size, d})},
        {"shared.down_proj.weight", Shape({d, cfg.moe.shared_intermediate_size})}};
    for (const auto& [name, shape] : want) {
      const Tensor* g = grads.find(p + name);
      ASSERT_NE(g, nullptr) << p + name;
      EXPECT_EQ(g->shape(), shape) << p + name;
    }
    EXPECT_EQ(grads.find(p + "shared_gate.weight") != nullptr, cfg.moe.shared_expert_gate);
  }

  WeightLoader w = WeightLoader::synthetic(cfg, 5);
  WeightLoader::Record record;
  w.set_recorder(&record);
  ASSERT_TRUE(Model::load(cfg, w).ok());
  const std::vector<int32_t> routed = routing(**model, record, tokens);
  const std::string dir = std::string(LOOM_TEST_TMPDIR) + "/moe_gradients_" + tag;
  for (const Direction& dir_case : dirs) {
    const Tensor* found = grads.find(dir_case.name);
    ASSERT_NE(found, nullptr) << dir_case.name;
    const Tensor& g = *found;
    double norm = 0;
    for (int64_t i = 0; i < g.numel(); ++i) norm += double{g.data<float>()[i]} * g.data<float>()[i];
    norm = std::sqrt(norm);
    ASSERT_GT(norm, 0) << dir_case.name;
    auto loss_at = [&](double h) {
      WeightLoader::Record moved;
      for (const auto& [name, t] : record) {
        Tensor c = t.to_f32().clone();
        if (name == dir_case.name)
          for (int64_t i = 0; i < c.numel(); ++i)
            c.data<float>()[i] += static_cast<float>(h * g.data<float>()[i] / norm);
        moved.emplace_back(name, c);
      }
      EXPECT_TRUE(write_native_checkpoint(cfg, moved, dir).ok());
      auto m = Model::load(dir);
      EXPECT_TRUE(m.ok()) << m.status();
      EXPECT_EQ(routing(**m, moved, tokens), routed)
          << dir_case.name << ": a token's experts changed at step " << h;
      Gradients unused;
      unused.set_aux_loss_alpha(aux_alpha);
      const double moved_ce = *(*m)->loss_and_gradients(tokens, unused);
      return moved_ce + unused.aux_loss();
    };
    // The unmoved checkpoint gives the same loss: the round trip is exact.
    ASSERT_EQ(loss_at(0.0), loss);
    const double h = dir_case.h;
    const double fd1 = (loss_at(h) - loss_at(-h)) / (2 * h);
    const double fd3 = (loss_at(h / 3) - loss_at(-h / 3)) / (2 * (h / 3));
    // The loss is an f32: a difference of two of them is a multiple of its ulp, so a central
    // difference at step s resolves the derivative to ulp / (2 s) at best. Each MoE layer's
    // load-balancing loss is an f32 too, of at most the sum's size.
    auto ulp_of = [](double x) {
      const float f = static_cast<float>(x);
      return static_cast<double>(std::nextafter(f, INFINITY) - f);
    };
    int moe_layers = 0;
    for (FfnType f : cfg.ffns) moe_layers += f == FfnType::kMoe;
    const double ulp = ulp_of(*ce) + (aux > 0 ? moe_layers * ulp_of(aux) : 0.0);
    auto tol = [&](double step) { return kModelGradTol * norm + ulp / (2 * step); };
    std::printf(
        "[model gradients] %s %-34s |g| %.6g; central differences %.6g at h = %.0e (rel %.2e, "
        "bound %.2e), %.6g at h / 3 (rel %.2e, bound %.2e)\n",
        tag, dir_case.name, norm, fd1, h, std::fabs(fd1 - norm) / norm, tol(h) / norm, fd3,
        std::fabs(fd3 - norm) / norm, tol(h / 3) / norm);
    EXPECT_NEAR(fd1, norm, tol(h)) << dir_case.name << " at h";
    EXPECT_NEAR(fd3, norm, tol(h / 3)) << dir_case.name << " at h / 3";
  }
}

ModelConfig kimi_kda_moe() {
  auto cfg = load_model_config(loom::testing::kFixtures + "/kimi_linear_s1");
  EXPECT_TRUE(cfg.ok()) << cfg.status();
  for (MixerType& m : cfg->mixers) m = MixerType::kKda;
  return *cfg;
}

// The same with qwen3_next's router: softmax scores, no selection bias, no groups, no scaling.
ModelConfig kimi_kda_softmax_moe() {
  ModelConfig cfg = kimi_kda_moe();
  cfg.moe.score_sigmoid = false;
  cfg.moe.has_score_bias = false;
  cfg.moe.n_group = 1;
  cfg.moe.topk_group = 1;
  cfg.moe.routed_scaling = 1.0f;
  return cfg;
}

// kimi_linear_s1 with KDA mixers: sigmoid router with the score-correction bias, two groups of
// six experts (one kept), top-3, renormalised, scaled by 2.446, one shared expert. Each step is the
// largest of 1e-2, 3e-3 and 1e-3 at which no token's experts change (at +-h and +-h / 3; larger
// steps flip some: layers.1.moe.experts.up at -3e-3).
TEST(MoeModelGradients, KimiMoeMatchesTheLossAlongTheGradient) {
  const ModelConfig cfg = kimi_kda_moe();
  ASSERT_EQ(cfg.ffns[1], FfnType::kMoe);
  const Direction dirs[] = {
      {"layers.1.moe.experts.up", 1e-3},    {"layers.1.moe.experts.gate", 1e-3},
      {"layers.3.moe.experts.down", 1e-2},  {"layers.1.moe.router.weight", 3e-3},
      {"layers.2.moe.router.weight", 1e-2}, {"layers.4.moe.shared.up_proj.weight", 1e-2}};
  check_directions(cfg, "kimi", dirs);
}

// The gradients of check_directions' model and tokens without and with the load-balancing loss
// (alpha 1).
std::pair<Gradients, Gradients> gradients_without_and_with_aux(const ModelConfig& cfg) {
  auto model = Model::load(cfg, WeightLoader::synthetic(cfg, 5));
  EXPECT_TRUE(model.ok()) << model.status();
  std::vector<int32_t> tokens(29);
  std::mt19937 rng(2);
  std::uniform_int_distribution<int> tok(0, cfg.vocab_size - 1);
  for (int32_t& t : tokens) t = tok(rng);
  std::pair<Gradients, Gradients> out;
  out.second.set_aux_loss_alpha(1.0f);
  EXPECT_TRUE((*model)->loss_and_gradients(tokens, out.first).ok());
  EXPECT_TRUE((*model)->loss_and_gradients(tokens, out.second).ok());
  EXPECT_EQ(out.first.aux_loss(), 0.0);
  return out;
}

// The load-balancing loss must be a sizeable part of a router's gradient, or a check of the sum
// would pass without it: |g_with - g_without| / |g_without| > 0.1.
void expect_large_aux_part(const std::pair<Gradients, Gradients>& g, const char* name) {
  const Tensor& a = *g.first.find(name);
  const Tensor& b = *g.second.find(name);
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    diff += std::pow(double{b.data<float>()[i]} - a.data<float>()[i], 2);
    norm += std::pow(double{a.data<float>()[i]}, 2);
  }
  std::printf("[model gradients] aux part of %s: |g_aux - g| / |g| = %.3f\n", name,
              std::sqrt(diff / norm));
  EXPECT_GT(std::sqrt(diff / norm), 0.1) << name;
}

// The auxiliary load-balancing loss (alpha 1, so that its part of the routers' gradients is
// large: measured 0.78 and 2.2 of the cross-entropy's) through the whole backward: the router
// weights of two MoE layers, and the FFN norm of an MoE layer, whose gradient reaches it only
// through d_x (the router's part included). Steps as above: the largest of 1e-2, 3e-3 and 1e-3
// (3e-4 for the softmax router) at which no token's experts change; the load-balancing loss
// pushes the routers towards their decision boundaries, so they are smaller than without it.
TEST(MoeModelGradients, AuxLossMatchesTheLossAlongTheGradient) {
  const ModelConfig cfg = kimi_kda_moe();
  const auto g = gradients_without_and_with_aux(cfg);
  expect_large_aux_part(g, "layers.1.moe.router.weight");
  expect_large_aux_part(g, "layers.2.moe.router.weight");
  // The last MoE layer's expert weights do not see the routing loss (earlier layers' do: the
  // later routers' part of d_x reaches them through the residual stream), and no bias has a
  // gradient (check_directions).
  const Tensor& ga = *g.first.find("layers.4.moe.experts.up");
  const Tensor& gb = *g.second.find("layers.4.moe.experts.up");
  EXPECT_EQ(std::memcmp(ga.raw(), gb.raw(), ga.nbytes()), 0);
  const Direction dirs[] = {{"layers.1.moe.router.weight", 3e-3},
                            {"layers.2.moe.router.weight", 3e-3},
                            {"layers.1.ffn_norm.weight", 3e-3}};
  check_directions(cfg, "kimi_aux", dirs, 1.0f);
}

TEST(MoeModelGradients, SoftmaxAuxLossMatchesTheLossAlongTheGradient) {
  ModelConfig cfg = kimi_kda_softmax_moe();
  expect_large_aux_part(gradients_without_and_with_aux(cfg), "layers.1.moe.router.weight");
  const Direction dirs[] = {{"layers.1.moe.router.weight", 3e-4},
                            {"layers.1.ffn_norm.weight", 3e-3}};
  check_directions(cfg, "softmax_aux", dirs, 1.0f);
}

// The same model with qwen3_next's MoE: a softmax router without bias or groups, and the shared
// expert scaled by sigmoid(shared_gate(x)).
TEST(MoeModelGradients, SoftmaxRouterAndSharedGateMatchTheLossAlongTheGradient) {
  ModelConfig cfg = kimi_kda_softmax_moe();
  cfg.moe.shared_expert_gate = true;
  const Direction dirs[] = {{"layers.1.moe.experts.up", 3e-3},
                            {"layers.1.moe.router.weight", 1e-3},
                            {"layers.3.moe.shared_gate.weight", 1e-2}};
  check_directions(cfg, "softmax", dirs);
}

}  // namespace
}  // namespace loom
