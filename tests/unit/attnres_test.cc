// attnres_aggregate (Block Attention Residuals, MODELS.md) against a double oracle written from the
// reference (fla naive_attnres, then the consuming sublayer's RMSNorm):
//   k_i = rmsnorm_r(v_i);  p = softmax_i(k_i . w);  m = sum_i p_i v_i;  out = rmsnorm_o(m)
// with eps inside the square roots of both norms.
#include "kernels/attnres.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace loom {
namespace {

Tensor random_tensor(Shape shape, std::mt19937& rng, float scale) {
  Tensor t = Tensor::empty(shape);
  std::normal_distribution<float> dist(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

// The sources stacked as the model keeps them: [S, N, D], the first S entries of a workspace
// tensor with room for more (the unused tail is poisoned: the kernel must not read it).
Tensor stack(const std::vector<Tensor>& src) {
  const int64_t n = src[0].dim(0), d = src[0].dim(1), s = static_cast<int64_t>(src.size());
  Tensor room = Tensor::full({s + 2, n, d}, std::nanf(""));
  for (int64_t i = 0; i < s; ++i) room.select(i).copy_from(src[i]);
  return room.slice(0, 0, s);
}

// out[t] in double for row t.
std::vector<double> oracle_row(const std::vector<Tensor>& src, const Tensor& w, const Tensor& r,
                               const Tensor& o, double eps, int64_t t) {
  const int64_t d = w.numel();
  const size_t m = src.size();
  std::vector<double> logit(m);
  for (size_t i = 0; i < m; ++i) {
    const float* v = src[i].data<float>() + t * d;
    double ss = 0, dot = 0;
    for (int64_t j = 0; j < d; ++j) ss += double(v[j]) * v[j];
    const double inv = 1.0 / std::sqrt(ss / d + eps);
    for (int64_t j = 0; j < d; ++j)
      dot += v[j] * inv * double(r.data<float>()[j]) * w.data<float>()[j];
    logit[i] = dot;
  }
  double mx = logit[0], z = 0;
  for (double l : logit) mx = std::max(mx, l);
  for (double& l : logit) z += (l = std::exp(l - mx));
  std::vector<double> mix(d, 0.0);
  for (size_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < d; ++j) mix[j] += logit[i] / z * src[i].data<float>()[t * d + j];
  double ss = 0;
  for (double x : mix) ss += x * x;
  const double inv = 1.0 / std::sqrt(ss / d + eps);
  for (int64_t j = 0; j < d; ++j) mix[j] *= inv * o.data<float>()[j];
  return mix;
}

// Max over rows of max_j |got - ref| / rms(ref row): the output is normalised, so its rows are
// O(|o|) and this is a relative error.
double max_row_error(const Tensor& got, const std::vector<Tensor>& src, const Tensor& w,
                     const Tensor& r, const Tensor& o, double eps) {
  const int64_t n = got.dim(0), d = got.dim(1);
  double worst = 0;
  for (int64_t t = 0; t < n; ++t) {
    const std::vector<double> ref = oracle_row(src, w, r, o, eps, t);
    double ss = 0, e = 0;
    for (int64_t j = 0; j < d; ++j) {
      ss += ref[j] * ref[j];
      e = std::max(e, std::abs(got.data<float>()[t * d + j] - ref[j]));
    }
    worst = std::max(worst, e / std::sqrt(ss / d));
  }
  return worst;
}

// Sums of D products in f32, a softmax over a handful of logits and a second norm: the worst case
// below is ~7e-6 (printed). 2e-5 leaves 3x margin and is 10x below what eps outside the square
// root produces in either norm (2e-4 and up) and 1e5x below a missing key-norm weight.
constexpr double kTol = 2e-5;

TEST(AttnRes, MatchesDoubleOracleAtOddSizes) {
  std::mt19937 rng(7);
  const float eps = 1e-6f;
  double worst = 0;
  for (int64_t d : {1, 7, 129, 300}) {
    for (size_t m : {1, 2, 3, 6}) {
      const int64_t n = 37;
      std::vector<Tensor> src;
      // Sources of very different sizes, as in a real model (the embedding is small, later block
      // sums large); the smallest (rms 1e-4, mean square 1e-8) puts eps to work in the key norm.
      const float scales[] = {0.02f, 3.0f, 1e-4f, 0.5f, 40.0f, 1.0f};
      for (size_t i = 0; i < m; ++i) src.push_back(random_tensor({n, d}, rng, scales[i]));
      // Logits k_i . w of rms ~3: a softmax far from uniform, yet not so peaked that the f32
      // rounding of a logit (~sqrt(D) ulps of |w| |k|) is itself amplified by the sources' spread.
      const Tensor w = random_tensor({d}, rng, 3.0f / std::sqrt(float(d)));
      const Tensor r = random_tensor({d}, rng, 1.0f);
      const Tensor o = random_tensor({d}, rng, 1.0f);
      Tensor out = Tensor::empty({n, d});
      attnres_aggregate(host_exec(), stack(src), w, r, o, eps, out);
      const double err = max_row_error(out, src, w, r, o, eps);
      worst = std::max(worst, err);
      EXPECT_LT(err, kTol) << "d=" << d << " sources=" << m;
    }
  }
  std::printf("[attnres] worst row-relative error vs double: %.3g\n", worst);
}

// A near-zero source: its key is eps-dominated (rmsnorm of a row with mean square << eps), and a
// near-zero mix makes the output norm eps-dominated too. Both must follow the oracle, eps inside
// the square root as torch's RMSNorm has it.
TEST(AttnRes, NearZeroSourcesFollowTheEpsOfTheReference) {
  std::mt19937 rng(8);
  const float eps = 1e-6f;
  const int64_t n = 19, d = 65;
  for (float tiny : {1e-3f, 1e-5f, 0.0f}) {
    std::vector<Tensor> src = {random_tensor({n, d}, rng, tiny), random_tensor({n, d}, rng, tiny)};
    const Tensor w = random_tensor({d}, rng, 2.0f);
    const Tensor r = random_tensor({d}, rng, 1.0f);
    const Tensor o = random_tensor({d}, rng, 1.0f);
    Tensor out = Tensor::empty({n, d});
    attnres_aggregate(host_exec(), stack(src), w, r, o, eps, out);
    if (tiny == 0.0f) {
      for (int64_t i = 0; i < out.numel(); ++i) ASSERT_EQ(out.data<float>()[i], 0.0f);
      continue;
    }
    EXPECT_LT(max_row_error(out, src, w, r, o, eps), kTol) << "source rms " << tiny;
  }
}

// Each row is computed on its own: a row's output does not depend on the other rows in the call.
TEST(AttnRes, RowsAreIndependentOfTheBatch) {
  std::mt19937 rng(9);
  const int64_t n = 33, d = 130;
  std::vector<Tensor> src;
  for (int i = 0; i < 3; ++i) src.push_back(random_tensor({n, d}, rng, 1.0f + i));
  const Tensor w = random_tensor({d}, rng, 1.0f);
  const Tensor r = random_tensor({d}, rng, 1.0f);
  const Tensor o = random_tensor({d}, rng, 1.0f);
  Tensor all = Tensor::empty({n, d});
  attnres_aggregate(host_exec(), stack(src), w, r, o, 1e-6f, all);
  for (int64_t t : {0, 17, 32}) {
    std::vector<Tensor> one;
    for (const Tensor& s : src) one.push_back(s.slice(0, t, t + 1).clone());
    Tensor row = Tensor::empty({1, d});
    attnres_aggregate(host_exec(), stack(one), w, r, o, 1e-6f, row);
    for (int64_t j = 0; j < d; ++j) ASSERT_EQ(row.data<float>()[j], all.data<float>()[t * d + j]);
  }
}

}  // namespace
}  // namespace loom
