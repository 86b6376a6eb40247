// attnres_aggregate_backward against central differences of a double reference forward
// (tests/unit/gradcheck_support.h describes the method): gradients for every source, the
// pseudo-query, the key norm and the output norm, for one source (the first sublayer after the
// embedding: a softmax over one logit) and several, over more tokens than one parameter-gradient
// block.
//
// Bounds. A source gradient is a few D-term f32 dot products (the two norms, dm . v_i) combined
// through a softmax over S <= 5 logits: ~(3 D + 2 S) u ~ 2.6e-6 worst case at D = 13, ~sqrt of it
// typically; the parameter gradients add a sum over N <= 37 tokens. 2e-6 relative L2, ~6x the
// worst measured (3.4e-7).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/attnres.h"
#include "tests/unit/gradcheck_support.h"

namespace loom::gradcheck {
namespace {

constexpr double kGradTol = 2e-6;
constexpr double kForwardTol = 2e-6;  // attnres_test's bound for the forward

// out [N, D] in double: k_i = rmsnorm_r(v_i); p = softmax(k_i . w); m = sum p_i v_i;
// out = rmsnorm_o(m).
std::vector<double> attnres_ref(const std::vector<double>& src, const std::vector<double>& w,
                                const std::vector<double>& r, const std::vector<double>& o,
                                int64_t s, int64_t n, int64_t d, double eps) {
  std::vector<double> out(n * d), logit(s);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < s; ++i) {
      const double* v = src.data() + (i * n + t) * d;
      double ss = 0, dot = 0;
      for (int64_t j = 0; j < d; ++j) ss += v[j] * v[j];
      const double inv = 1.0 / std::sqrt(ss / d + eps);
      for (int64_t j = 0; j < d; ++j) dot += v[j] * inv * r[j] * w[j];
      logit[i] = dot;
    }
    double mx = logit[0], z = 0;
    for (double l : logit) mx = std::max(mx, l);
    for (double& l : logit) z += (l = std::exp(l - mx));
    double* mix = out.data() + t * d;
    for (int64_t i = 0; i < s; ++i)
      for (int64_t j = 0; j < d; ++j) mix[j] += logit[i] / z * src[(i * n + t) * d + j];
    double ss = 0;
    for (int64_t j = 0; j < d; ++j) ss += mix[j] * mix[j];
    const double inv = 1.0 / std::sqrt(ss / d + eps);
    for (int64_t j = 0; j < d; ++j) mix[j] *= inv * o[j];
  }
  return out;
}

struct AttnResCase {
  int64_t s, n, d;
};

class AttnResBackward : public ::testing::TestWithParam<AttnResCase> {};

TEST_P(AttnResBackward, MatchesFiniteDifferences) {
  const auto [s, n, d] = GetParam();
  std::mt19937 rng(static_cast<unsigned>(s * 1000 + n * 10 + d));
  const float eps = 1e-6f;
  // Sources of different scales, as block sums of growing depth are.
  Tensor sources = random_tensor({s, n, d}, rng, -1.0f, 1.0f);
  for (int64_t i = 0; i < s; ++i)
    for (int64_t k = 0; k < n * d; ++k) sources.data<float>()[i * n * d + k] *= 1.0f + i;
  // |w| ~ 1 over D dims gives logits of O(1): a softmax neither uniform nor one-hot.
  Tensor w = random_tensor({d}, rng, -1.0f, 1.0f);
  Tensor r = random_tensor({d}, rng, 0.5f, 1.5f), o = random_tensor({d}, rng, 0.5f, 1.5f);
  Tensor proj = random_tensor({n, d}, rng);
  std::vector<double> sd = to_double(sources), wd = to_double(w), rd = to_double(r),
                      od = to_double(o);
  auto j = [&] { return project(attnres_ref(sd, wd, rd, od, s, n, d, eps), proj); };

  Tensor out = Tensor::empty({n, d});
  attnres_aggregate(host_exec(), sources, w, r, o, eps, out);
  expect_forward_close("attnres", out, attnres_ref(sd, wd, rd, od, s, n, d, eps), kForwardTol);

  Tensor dsrc = Tensor::empty({s, n, d});
  Tensor dw = Tensor::zeros({d}), dr = Tensor::zeros({d}), dout_norm = Tensor::zeros({d});
  attnres_aggregate_backward(host_exec(), sources, w, r, o, eps, proj, dsrc, dw, dr, dout_norm);
  expect_grad_close("attnres dsources", dsrc, central_diff(j, sd), kGradTol);
  expect_grad_close("attnres dout_norm", dout_norm, central_diff(j, od), kGradTol);
  if (s > 1) {
    expect_grad_close("attnres dquery", dw, central_diff(j, wd), kGradTol);
    expect_grad_close("attnres dkey_norm", dr, central_diff(j, rd), kGradTol);
  } else {
    // One source: the softmax is 1 whatever the logit, so query and key norm get nothing.
    for (int64_t k = 0; k < d; ++k) {
      EXPECT_EQ(dw.data<float>()[k], 0.0f);
      EXPECT_EQ(dr.data<float>()[k], 0.0f);
    }
  }

  // dsources may alias sources: the same bits; the parameter gradients are accumulated onto what
  // they held.
  const Tensor base = random_tensor({3, d}, rng);
  Tensor alias = sources.clone();
  Tensor dw2 = base.select(0).clone(), dr2 = base.select(1).clone(), do2 = base.select(2).clone();
  attnres_aggregate_backward(host_exec(), alias, w, r, o, eps, proj, alias, dw2, dr2, do2);
  EXPECT_EQ(std::memcmp(alias.raw(), dsrc.raw(), dsrc.nbytes()), 0);
  expect_accumulated("attnres dquery", base.select(0), dw, dw2);
  expect_accumulated("attnres dkey_norm", base.select(1), dr, dr2);
  expect_accumulated("attnres dout_norm", base.select(2), dout_norm, do2);
}

INSTANTIATE_TEST_SUITE_P(Cases, AttnResBackward,
                         ::testing::Values(AttnResCase{1, 5, 7}, AttnResCase{4, 5, 7},
                                           AttnResCase{5, 37, 13}, AttnResCase{2, 17, 3}));

// Same inputs, same bits, whatever the thread count (sizes above the parallel threshold).
TEST(AttnResBackward, SameBitsForAnyThreadCount) {
  std::mt19937 rng(12);
  const int64_t s = 4, n = 301, d = 65;
  Tensor src = random_tensor({s, n, d}, rng), w = random_tensor({d}, rng);
  Tensor r = random_tensor({d}, rng, 0.5f, 1.5f), o = random_tensor({d}, rng, 0.5f, 1.5f);
  Tensor g = random_tensor({n, d}, rng);
  expect_same_bits_for_any_thread_count([&](int) {
    Tensor ds = Tensor::empty({s, n, d}), dp = Tensor::zeros({3, d});
    attnres_aggregate_backward(host_exec(), src, w, r, o, 1e-6f, g, ds, dp.select(0), dp.select(1),
                               dp.select(2));
    return std::vector<Tensor>{ds, dp};
  });
}

}  // namespace
}  // namespace loom::gradcheck
