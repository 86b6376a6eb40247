// cross_entropy_forward_backward against a direct double-precision softmax cross-entropy (the full
// [T, V] logits in double, the textbook gradient (softmax - onehot) / count), whose gradient is
// itself checked by central differences on a small case. Sizes cross both chunkings of the CPU
// kernel (more than 256 counted rows, a vocabulary of more than 4096 with a partial last chunk),
// with ignored rows, i32 and i64 targets, loss_scale, the loss-only form and an all-ignored batch.
//
// Bounds. A logit is an f32 dot product over D = 37 terms of O(1 / sqrt(D)) magnitude each side:
// absolute error ~sqrt(D) u |h| |w| ~ 1e-7. The log-sum-exp adds the rounding of a sum of V
// positive terms (~sqrt(V) u relative, 4e-6 at V = 5003, typically far less) and the loss is
// O(log V) = 8.5, so the mean loss and the row losses hold 1e-6 relative. A gradient entry is
// (p - onehot) * coef with p good to the logit's and the lse's absolute error, then a GEMM over
// V (dhidden) or the rows of a chunk (dlm_head) of such entries; dhidden = sum_v p_v w_v - w_y
// cancels about one order of magnitude: 1e-5 relative L2, ~9x the worst measured (1.1e-6, the
// batch-invariant GEMM's longer sequential sums; 3.8e-7 with OpenBLAS).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/loss.h"
#include "tests/unit/gradcheck_support.h"

namespace loom::gradcheck {
namespace {

constexpr int64_t kIgnore = -100;
constexpr double kLossTol = 1e-6;
constexpr double kGradTol = 1e-5;

struct Reference {
  double loss = 0;
  std::vector<double> row_loss, dhidden, dlm_head;
};

// The direct computation: every logit in double, a two-pass softmax per row.
Reference cross_entropy_ref(const std::vector<double>& h, const std::vector<double>& w,
                            const std::vector<int64_t>& y, int64_t v, int64_t d, double scale,
                            bool grads = true) {
  const int64_t t_count = static_cast<int64_t>(y.size());
  Reference ref;
  ref.row_loss.assign(t_count, 0.0);
  ref.dhidden.assign(t_count * d, 0.0);
  ref.dlm_head.assign(v * d, 0.0);
  int64_t counted = 0;
  for (int64_t t : y) counted += t != kIgnore;
  std::vector<double> logits(v);
  for (int64_t t = 0; t < t_count; ++t) {
    if (y[t] == kIgnore) continue;
    double mx = -INFINITY;
    for (int64_t j = 0; j < v; ++j) {
      double s = 0;
      for (int64_t k = 0; k < d; ++k) s += h[t * d + k] * w[j * d + k];
      logits[j] = s;
      mx = std::max(mx, s);
    }
    double z = 0;
    for (int64_t j = 0; j < v; ++j) z += std::exp(logits[j] - mx);
    const double lse = mx + std::log(z);
    ref.row_loss[t] = lse - logits[y[t]];
    ref.loss += ref.row_loss[t] / counted;
    if (!grads) continue;
    for (int64_t j = 0; j < v; ++j) {
      const double g = (std::exp(logits[j] - lse) - (j == y[t])) * scale / counted;
      for (int64_t k = 0; k < d; ++k) {
        ref.dhidden[t * d + k] += g * w[j * d + k];
        ref.dlm_head[j * d + k] += g * h[t * d + k];
      }
    }
  }
  return ref;
}

double rel(double got, double ref) { return std::abs(got - ref) / std::abs(ref); }

struct Problem {
  Tensor hidden, lm_head, targets;
  std::vector<int64_t> y;
};

// Hidden rows O(1), head rows O(1 / sqrt(D)): logits of O(1) spread. A fraction of the targets is
// ignore_index.
Problem make_problem(int64_t t_count, int64_t v, int64_t d, DType id_type, double ignored,
                     unsigned seed) {
  std::mt19937 rng(seed);
  Problem p;
  p.hidden = random_tensor({t_count, d}, rng, -1.0f, 1.0f);
  const float a = 2.0f / std::sqrt(static_cast<float>(d));
  p.lm_head = random_tensor({v, d}, rng, -a, a);
  p.targets = Tensor::empty({t_count}, id_type);
  std::uniform_int_distribution<int64_t> pick(0, v - 1);
  std::bernoulli_distribution skip(ignored);
  for (int64_t t = 0; t < t_count; ++t) {
    const int64_t y = skip(rng) ? kIgnore : pick(rng);
    p.y.push_back(y);
    if (id_type == DType::kI32) {
      p.targets.data<int32_t>()[t] = static_cast<int32_t>(y);
    } else {
      p.targets.data<int64_t>()[t] = y;
    }
  }
  return p;
}

struct LossCase {
  int64_t t, v, d;
  DType ids;
  double ignored;
  float scale;
};

class CrossEntropy : public ::testing::TestWithParam<LossCase> {};

TEST_P(CrossEntropy, MatchesDirectDoubleSoftmax) {
  const LossCase c = GetParam();
  Problem p = make_problem(c.t, c.v, c.d, c.ids, c.ignored, static_cast<unsigned>(c.t + c.v));
  const Reference ref =
      cross_entropy_ref(to_double(p.hidden), to_double(p.lm_head), p.y, c.v, c.d, c.scale);
  for (const bool invariant : {false, true}) {
    // Default numerics (OpenBLAS) and batch-invariant ones (Loom's fixed-order GEMM).
    Exec ex;
    ex.batch_invariant = invariant;
    Tensor loss = Tensor::empty({1}), row_loss = Tensor::full({c.t}, NAN);
    Tensor dhidden = Tensor::full({c.t, c.d}, NAN), dlm_head = Tensor::zeros({c.v, c.d});
    cross_entropy_forward_backward(ex, p.hidden, p.lm_head, p.targets, kIgnore, c.scale, loss,
                                   row_loss, dhidden, dlm_head);
    const double loss_err = rel(loss.data<float>()[0], ref.loss);
    std::printf("[gradcheck] %-40s rel %.3e (bound %.1e)\n",
                invariant ? "cross_entropy loss (invariant)" : "cross_entropy loss", loss_err,
                kLossTol);
    EXPECT_LE(loss_err, kLossTol);
    expect_grad_close("cross_entropy row_loss", row_loss, ref.row_loss, kLossTol);
    expect_grad_close("cross_entropy dhidden", dhidden, ref.dhidden, kGradTol);
    expect_grad_close("cross_entropy dlm_head", dlm_head, ref.dlm_head, kGradTol);
    for (int64_t t = 0; t < c.t; ++t) {
      if (p.y[t] != kIgnore) continue;
      EXPECT_EQ(row_loss.data<float>()[t], 0.0f);
      for (int64_t k = 0; k < c.d; ++k) ASSERT_EQ(dhidden.data<float>()[t * c.d + k], 0.0f);
    }
    // dlm_head is accumulated: a second call adds the same gradient again.
    cross_entropy_forward_backward(ex, p.hidden, p.lm_head, p.targets, kIgnore, c.scale, loss,
                                   Tensor(), Tensor(), dlm_head);
    std::vector<double> twice = ref.dlm_head;
    for (double& g : twice) g *= 2;
    expect_grad_close("cross_entropy dlm_head, twice", dlm_head, twice, kGradTol);
    // The loss alone: the same loss bits.
    Tensor loss2 = Tensor::empty({1});
    cross_entropy_forward_backward(ex, p.hidden, p.lm_head, p.targets, kIgnore, c.scale, loss2,
                                   Tensor(), Tensor(), Tensor());
    EXPECT_EQ(loss2.data<float>()[0], loss.data<float>()[0]);
  }
}

// The second case runs 2 row chunks by 2 vocabulary chunks (the last one partial).
INSTANTIATE_TEST_SUITE_P(Cases, CrossEntropy,
                         ::testing::Values(LossCase{5, 11, 7, DType::kI64, 0.2, 1.0f},
                                           LossCase{330, 5003, 37, DType::kI32, 0.1, 1.0f},
                                           LossCase{41, 4099, 13, DType::kI64, 0.0, 0.375f}));

// The oracle's gradient is the derivative of its loss (central differences, small case).
TEST(CrossEntropy, OracleGradientMatchesFiniteDifferences) {
  Problem p = make_problem(4, 9, 5, DType::kI64, 0.25, 3);
  std::vector<double> h = to_double(p.hidden), w = to_double(p.lm_head);
  const Reference ref = cross_entropy_ref(h, w, p.y, 9, 5, 1.0);
  auto f = [&] { return cross_entropy_ref(h, w, p.y, 9, 5, 1.0, false).loss; };
  const std::vector<double> gh = central_diff(f, h), gw = central_diff(f, w);
  for (size_t i = 0; i < gh.size(); ++i) EXPECT_NEAR(gh[i], ref.dhidden[i], 1e-8);
  for (size_t i = 0; i < gw.size(); ++i) EXPECT_NEAR(gw[i], ref.dlm_head[i], 1e-8);
}

TEST(CrossEntropy, AllIgnoredGivesZeroLossAndGradient) {
  Problem p = make_problem(6, 13, 5, DType::kI32, 1.0, 4);
  Tensor loss = Tensor::full({1}, NAN), row_loss = Tensor::full({6}, NAN);
  Tensor dhidden = Tensor::full({6, 5}, NAN), dlm_head = Tensor::full({13, 5}, 0.5f);
  cross_entropy_forward_backward(host_exec(), p.hidden, p.lm_head, p.targets, kIgnore, 1.0f, loss,
                                 row_loss, dhidden, dlm_head);
  EXPECT_EQ(loss.data<float>()[0], 0.0f);
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(row_loss.data<float>()[i], 0.0f);
  for (int64_t i = 0; i < 30; ++i) EXPECT_EQ(dhidden.data<float>()[i], 0.0f);
  for (int64_t i = 0; i < 65; ++i) EXPECT_EQ(dlm_head.data<float>()[i], 0.5f);
}

// Batch-invariant numerics: same inputs, same bits, whatever the thread count. Default numerics:
// the same bits from call to call at one thread count (OpenBLAS's own results change with its
// thread count).
TEST(CrossEntropy, SameBitsForAnyThreadCountWhenBatchInvariant) {
  Problem p = make_problem(300, 4500, 64, DType::kI64, 0.1, 5);
  auto run = [&](const Exec& ex) {
    Tensor all = Tensor::zeros({1 + 300 + 300 * 64 + 4500 * 64});
    cross_entropy_forward_backward(ex, p.hidden, p.lm_head, p.targets, kIgnore, 1.0f,
                                   all.slice(0, 0, 1), all.slice(0, 1, 301),
                                   all.slice(0, 301, 301 + 300 * 64).reshape({300, 64}),
                                   all.slice(0, 301 + 300 * 64, all.numel()).reshape({4500, 64}));
    return all;
  };
  Exec invariant;
  invariant.batch_invariant = true;
  expect_same_bits_for_any_thread_count([&](int threads) {
    Tensor out = run(invariant);
    const Tensor a = run(host_exec()), b = run(host_exec());
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << threads;
    return std::vector<Tensor>{out};
  });
}

TEST(CrossEntropyDeathTest, RejectsTargetOutOfRange) {
  Problem p = make_problem(3, 7, 5, DType::kI64, 0.0, 6);
  p.targets.data<int64_t>()[1] = 7;
  Tensor loss = Tensor::empty({1});
  EXPECT_DEATH(cross_entropy_forward_backward(host_exec(), p.hidden, p.lm_head, p.targets, kIgnore,
                                              1.0f, loss, Tensor(), Tensor(), Tensor()),
               "outside");
}

}  // namespace
}  // namespace loom::gradcheck
