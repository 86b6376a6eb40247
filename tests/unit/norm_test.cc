// rmsnorm_forward and l2norm_forward against double references.
#include "kernels/norm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace loom {
namespace {

Tensor random_tensor(Shape shape, std::mt19937& rng, float lo, float hi) {
  Tensor t = Tensor::empty(shape);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

// A sum of D squares in f32 (relative error <= D * eps in the worst case, ~sqrt(D) * eps
// typically), a sqrt and two products: 2e-5 relative at D = 129..4099 holds with margin.
constexpr double kRelTol = 2e-5;

class RmsNormTest : public ::testing::TestWithParam<float> {};

TEST_P(RmsNormTest, MatchesDouble) {
  const float offset = GetParam();
  std::mt19937 rng(21);
  for (int64_t d : {129, 4099}) {
    const int64_t n = 37;
    Tensor x = random_tensor({n, d}, rng, -3.0f, 3.0f);
    Tensor w = random_tensor({d}, rng, -1.0f, 1.0f);
    Tensor out = Tensor::empty({n, d});
    const float eps = 1e-6f;
    rmsnorm_forward(host_exec(), x, w, eps, offset, out);
    for (int64_t r = 0; r < n; ++r) {
      double ss = 0.0;
      for (int64_t i = 0; i < d; ++i) ss += double(x.at<float>({r, i})) * x.at<float>({r, i});
      const double inv = 1.0 / std::sqrt(ss / d + eps);
      for (int64_t i = 0; i < d; ++i) {
        const double ref = (offset + double(w.data<float>()[i])) * x.at<float>({r, i}) * inv;
        ASSERT_NEAR(out.at<float>({r, i}), ref, kRelTol * (std::abs(ref) + 1e-3)) << r << "," << i;
      }
    }
    // In place.
    Tensor y = x.clone();
    rmsnorm_forward(host_exec(), y, w, eps, offset, y);
    for (int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(y.data<float>()[i], out.data<float>()[i]);
  }
}

INSTANTIATE_TEST_SUITE_P(Offsets, RmsNormTest, ::testing::Values(0.0f, 1.0f));

TEST(L2Norm, MatchesDoubleAnyLeadingShape) {
  std::mt19937 rng(8);
  const int64_t d = 129;
  Tensor x = random_tensor({5, 7, d}, rng, -2.0f, 2.0f);
  Tensor out = Tensor::empty({5, 7, d});
  const float eps = 1e-6f, scale = 0.37f;
  l2norm_forward(host_exec(), x, eps, scale, out);
  for (int64_t r = 0; r < 35; ++r) {
    const float* xr = x.data<float>() + r * d;
    double ss = 0.0;
    for (int64_t i = 0; i < d; ++i) ss += double(xr[i]) * xr[i];
    for (int64_t i = 0; i < d; ++i) {
      const double ref = xr[i] / std::sqrt(ss + eps) * scale;
      ASSERT_NEAR(out.data<float>()[r * d + i], ref, kRelTol * (std::abs(ref) + 1e-3));
    }
  }
  // A zero row stays finite (eps guards the division).
  Tensor z = Tensor::zeros({1, d});
  l2norm_forward(host_exec(), z, eps, 1.0f, z);
  for (int64_t i = 0; i < d; ++i) ASSERT_EQ(z.data<float>()[i], 0.0f);
}

}  // namespace
}  // namespace loom
