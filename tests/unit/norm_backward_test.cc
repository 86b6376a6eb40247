// rmsnorm_backward and l2norm_backward against central differences of double reference forwards
// (tests/unit/gradcheck_support.h describes the method).
//
// Bounds. Every gradient element is one f32 dot product over a row of D <= 33 terms, a square root
// and a few products: at most (D + 4) u of the terms' magnitudes (u = 6e-8), and ~sqrt(D + 4) u =
// 3.6e-7 for rounding errors of random sign; dw adds a sum over N <= 15 rows. Random rows carry no
// cancellation beyond O(1), so 1e-6 relative L2 is ~3x the typical error and ~10x the worst
// measured (1.1e-7, printed as [gradcheck] lines).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/norm.h"
#include "tests/unit/gradcheck_support.h"

namespace loom::gradcheck {
namespace {

constexpr double kGradTol = 1e-6;
constexpr double kForwardTol = 1e-6;  // D + 3 roundings of O(1) values, D <= 33

std::vector<double> rmsnorm_ref(const std::vector<double>& x, const std::vector<double>& w,
                                double eps, double offset) {
  const size_t d = w.size(), n = x.size() / d;
  std::vector<double> out(x.size());
  for (size_t r = 0; r < n; ++r) {
    double ss = 0;
    for (size_t i = 0; i < d; ++i) ss += x[r * d + i] * x[r * d + i];
    const double inv = 1.0 / std::sqrt(ss / d + eps);
    for (size_t i = 0; i < d; ++i) out[r * d + i] = (offset + w[i]) * x[r * d + i] * inv;
  }
  return out;
}

std::vector<double> l2norm_ref(const std::vector<double>& x, size_t d, double eps, double scale) {
  std::vector<double> out(x.size());
  for (size_t r = 0; r < x.size() / d; ++r) {
    double ss = 0;
    for (size_t i = 0; i < d; ++i) ss += x[r * d + i] * x[r * d + i];
    for (size_t i = 0; i < d; ++i) out[r * d + i] = x[r * d + i] * scale / std::sqrt(ss + eps);
  }
  return out;
}

struct RmsCase {
  float offset;
  Shape shape;  // any leading shape, D last
};

class RmsNormBackward : public ::testing::TestWithParam<RmsCase> {};

TEST_P(RmsNormBackward, MatchesFiniteDifferences) {
  const RmsCase c = GetParam();
  std::mt19937 rng(1234);
  const int64_t d = c.shape[c.shape.ndim() - 1];
  const float eps = 1e-6f;
  Tensor x = random_tensor(c.shape, rng, -2.0f, 2.0f);
  // Zero-centred weights (offset 1) are stored around 0, plain ones around 1.
  Tensor w =
      random_tensor({d}, rng, c.offset == 0.0f ? 0.5f : -0.5f, c.offset == 0.0f ? 1.5f : 0.5f);
  Tensor r = random_tensor(c.shape, rng);
  std::vector<double> xd = to_double(x), wd = to_double(w);
  auto j = [&] { return project(rmsnorm_ref(xd, wd, eps, c.offset), r); };

  Tensor out = Tensor::empty(c.shape);
  rmsnorm_forward(host_exec(), x, w, eps, c.offset, out);
  expect_forward_close("rmsnorm", out, rmsnorm_ref(xd, wd, eps, c.offset), kForwardTol);

  Tensor dx = Tensor::empty(c.shape);
  Tensor dw = Tensor::zeros({d});
  rmsnorm_backward(host_exec(), x, w, eps, c.offset, r, dx, dw);
  expect_grad_close("rmsnorm dx", dx, central_diff(j, xd), kGradTol);
  expect_grad_close("rmsnorm dw", dw, central_diff(j, wd), kGradTol);
  const Tensor base = random_tensor({d}, rng);

  // dx may alias dout or x: the same bits; dw is accumulated onto what it held.
  for (int which = 0; which < 2; ++which) {
    Tensor alias = (which == 0 ? r : x).clone();
    Tensor dw2 = base.clone();
    rmsnorm_backward(host_exec(), which == 1 ? alias : x, w, eps, c.offset, which == 0 ? alias : r,
                     alias, dw2);
    EXPECT_EQ(std::memcmp(alias.raw(), dx.raw(), dx.nbytes()), 0) << "alias " << which;
    expect_accumulated("rmsnorm dw", base, dw, dw2);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, RmsNormBackward,
                         ::testing::Values(RmsCase{0.0f, {5, 7}}, RmsCase{1.0f, {5, 7}},
                                           RmsCase{0.0f, {3, 5, 33}}, RmsCase{1.0f, {1, 33}}));

TEST(L2NormBackward, MatchesFiniteDifferences) {
  std::mt19937 rng(99);
  for (const Shape shape : {Shape{5, 7}, Shape{3, 5, 33}, Shape{4, 2}}) {
    const int64_t d = shape[shape.ndim() - 1];
    const float eps = 1e-6f;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));  // KDA's q scale d_k^-0.5
    Tensor x = random_tensor(shape, rng, -2.0f, 2.0f);
    Tensor r = random_tensor(shape, rng);
    std::vector<double> xd = to_double(x);
    auto j = [&] { return project(l2norm_ref(xd, d, eps, scale), r); };
    Tensor out = Tensor::empty(shape);
    l2norm_forward(host_exec(), x, eps, scale, out);
    expect_forward_close("l2norm", out, l2norm_ref(xd, d, eps, scale), kForwardTol);
    Tensor dx = Tensor::empty(shape);
    l2norm_backward(host_exec(), x, eps, scale, r, dx);
    expect_grad_close("l2norm dx", dx, central_diff(j, xd), kGradTol);
    Tensor alias = r.clone();
    l2norm_backward(host_exec(), x, eps, scale, alias, alias);
    EXPECT_EQ(std::memcmp(alias.raw(), dx.raw(), dx.nbytes()), 0);
  }
}

// Same inputs, same bits, whatever the thread count (sizes above the kernels' parallel threshold).
TEST(NormBackward, SameBitsForAnyThreadCount) {
  std::mt19937 rng(5);
  const int64_t n = 301, d = 257;
  Tensor x = random_tensor({n, d}, rng, -2.0f, 2.0f);
  Tensor w = random_tensor({d}, rng);
  Tensor g = random_tensor({n, d}, rng);
  expect_same_bits_for_any_thread_count([&](int) {
    Tensor dx = Tensor::empty({n, d}), dw = Tensor::zeros({d}), dl = Tensor::empty({n, d});
    rmsnorm_backward(host_exec(), x, w, 1e-6f, 1.0f, g, dx, dw);
    l2norm_backward(host_exec(), x, 1e-6f, 0.5f, g, dl);
    return std::vector<Tensor>{dx, dw, dl};
  });
}

}  // namespace
}  // namespace loom::gradcheck
