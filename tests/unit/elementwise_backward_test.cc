// The elementwise backward passes (add_bias, mul_sigmoid, mul_sigmoid_rows, mul_silu, sigmoid,
// gather_rows) against central differences of double reference forwards
// (tests/unit/gradcheck_support.h describes the method).
//
// Bounds. Elementwise gradients are a handful of f32 operations per element (an exp good to ~1 ulp,
// a division, up to four products): <= ~8 u = 5e-7 relative per element; mul_sigmoid_rows' gate
// gradient adds a dot product over C = 13 terms (~sqrt(13) u more); add_bias' and gather_rows'
// sums have at most 9 terms. 1e-6 relative L2 throughout. The gate gradients take 1 - sigmoid(g)
// as sigmoid(-g), so gates up to |g| = 10 (saturated) keep their relative accuracy.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/elementwise.h"
#include "tests/unit/gradcheck_support.h"

namespace loom::gradcheck {
namespace {

constexpr double kGradTol = 1e-6;
constexpr double kForwardTol = 1e-6;

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

TEST(AddBiasBackward, MatchesFiniteDifferences) {
  std::mt19937 rng(1);
  const int64_t n = 9, c = 13;
  Tensor x = random_tensor({n, c}, rng), b = random_tensor({c}, rng),
         r = random_tensor({n, c}, rng);
  std::vector<double> bd = to_double(b);
  auto ref = [&] {
    std::vector<double> out(n * c);
    for (int64_t i = 0; i < n * c; ++i) out[i] = x.data<float>()[i] + bd[i % c];
    return out;
  };
  Tensor out = x.clone();
  add_bias(host_exec(), out, b);
  expect_forward_close("add_bias", out, ref(), kForwardTol);
  Tensor db = Tensor::zeros({c});
  add_bias_backward(host_exec(), r, db);
  expect_grad_close("add_bias dbias", db, central_diff([&] { return project(ref(), r); }, bd),
                    kGradTol);
  const Tensor base = random_tensor({c}, rng);
  Tensor db2 = base.clone();
  add_bias_backward(host_exec(), r, db2);
  expect_accumulated("add_bias dbias", base, db, db2);
}

// mul_sigmoid_inplace (silu = false) and mul_silu_inplace (silu = true).
void check_mul_gate(bool silu) {
  std::mt19937 rng(silu ? 2 : 3);
  const Shape shape{7, 13};
  Tensor x = random_tensor(shape, rng, -2.0f, 2.0f),
         gate = random_tensor(shape, rng, -10.0f, 10.0f);
  Tensor r = random_tensor(shape, rng);
  std::vector<double> xd = to_double(x), gd = to_double(gate);
  auto ref = [&] {
    std::vector<double> out(xd.size());
    for (size_t i = 0; i < xd.size(); ++i)
      out[i] = xd[i] * (silu ? gd[i] * sigmoid(gd[i]) : sigmoid(gd[i]));
    return out;
  };
  auto j = [&] { return project(ref(), r); };
  const char* name = silu ? "mul_silu" : "mul_sigmoid";
  Tensor out = x.clone();
  if (silu) {
    mul_silu_inplace(host_exec(), out, gate);
  } else {
    mul_sigmoid_inplace(host_exec(), out, gate);
  }
  expect_forward_close(name, out, ref(), kForwardTol);
  Tensor dx = Tensor::empty(shape), dgate = Tensor::empty(shape);
  auto backward = silu ? mul_silu_backward : mul_sigmoid_backward;
  backward(host_exec(), x, gate, r, dx, dgate);
  expect_grad_close(silu ? "mul_silu dx" : "mul_sigmoid dx", dx, central_diff(j, xd), kGradTol);
  expect_grad_close(silu ? "mul_silu dgate" : "mul_sigmoid dgate", dgate, central_diff(j, gd),
                    kGradTol);
  // In place over the inputs: the same bits.
  Tensor x2 = x.clone(), g2 = gate.clone();
  backward(host_exec(), x2, g2, r, x2, g2);
  EXPECT_EQ(std::memcmp(x2.raw(), dx.raw(), dx.nbytes()), 0);
  EXPECT_EQ(std::memcmp(g2.raw(), dgate.raw(), dgate.nbytes()), 0);
}

TEST(MulSigmoidBackward, MatchesFiniteDifferences) { check_mul_gate(false); }
TEST(MulSiluBackward, MatchesFiniteDifferences) { check_mul_gate(true); }

TEST(MulSigmoidRowsBackward, MatchesFiniteDifferences) {
  std::mt19937 rng(4);
  const int64_t n = 7, c = 13;
  Tensor x = random_tensor({n, c}, rng, -2.0f, 2.0f),
         gate = random_tensor({n, 1}, rng, -4.0f, 4.0f);
  Tensor r = random_tensor({n, c}, rng);
  std::vector<double> xd = to_double(x), gd = to_double(gate);
  auto ref = [&] {
    std::vector<double> out(n * c);
    for (int64_t i = 0; i < n * c; ++i) out[i] = xd[i] * sigmoid(gd[i / c]);
    return out;
  };
  auto j = [&] { return project(ref(), r); };
  Tensor out = x.clone();
  mul_sigmoid_rows(host_exec(), out, gate);
  expect_forward_close("mul_sigmoid_rows", out, ref(), kForwardTol);
  Tensor dx = Tensor::empty({n, c}), dgate = Tensor::empty({n, 1});
  mul_sigmoid_rows_backward(host_exec(), x, gate, r, dx, dgate);
  expect_grad_close("mul_sigmoid_rows dx", dx, central_diff(j, xd), kGradTol);
  expect_grad_close("mul_sigmoid_rows dgate", dgate, central_diff(j, gd), kGradTol);
  Tensor x2 = x.clone(), g2 = gate.clone();
  mul_sigmoid_rows_backward(host_exec(), x2, g2, r, x2, g2);
  EXPECT_EQ(std::memcmp(x2.raw(), dx.raw(), dx.nbytes()), 0);
  EXPECT_EQ(std::memcmp(g2.raw(), dgate.raw(), dgate.nbytes()), 0);
}

TEST(SigmoidBackward, MatchesFiniteDifferences) {
  std::mt19937 rng(5);
  const Shape shape{5, 11};
  // From the output y: 1 - y carries a relative error of u / (1 - y), ~400 u at |x| = 6 for the
  // smallest gradients, whose share of the L2 norm is small (the measured error stays ~2e-7).
  Tensor x = random_tensor(shape, rng, -6.0f, 6.0f), r = random_tensor(shape, rng);
  std::vector<double> xd = to_double(x);
  auto ref = [&] {
    std::vector<double> out(xd.size());
    for (size_t i = 0; i < xd.size(); ++i) out[i] = sigmoid(xd[i]);
    return out;
  };
  Tensor y = x.clone();
  sigmoid_inplace(host_exec(), y);
  expect_forward_close("sigmoid", y, ref(), kForwardTol);
  Tensor dx = Tensor::empty(shape);
  sigmoid_backward(host_exec(), y, r, dx);
  expect_grad_close("sigmoid dx", dx, central_diff([&] { return project(ref(), r); }, xd),
                    kGradTol);
}

TEST(GatherRowsBackward, MatchesFiniteDifferencesAndSerialSum) {
  std::mt19937 rng(6);
  const int64_t n_src = 8, c = 13, n = 17;
  Tensor rows = Tensor::empty({n}, DType::kI64);
  std::uniform_int_distribution<int64_t> pick(0, 4);  // repeats, and rows 5..7 never gathered
  for (int64_t i = 0; i < n; ++i) rows.data<int64_t>()[i] = pick(rng);
  Tensor src = random_tensor({n_src, c}, rng), r = random_tensor({n, c}, rng);
  std::vector<double> sd = to_double(src);
  auto ref = [&] {
    std::vector<double> out(n * c);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < c; ++j) out[i * c + j] = sd[rows.data<int64_t>()[i] * c + j];
    return out;
  };
  Tensor dst = Tensor::empty({n, c});
  gather_rows(host_exec(), src, rows, dst);
  expect_forward_close("gather_rows", dst, ref(), 0.0);
  Tensor dsrc = Tensor::zeros({n_src, c});
  gather_rows_backward(host_exec(), r, rows, dsrc);
  expect_grad_close("gather_rows dsrc", dsrc, central_diff([&] { return project(ref(), r); }, sd),
                    kGradTol);
  Tensor serial = Tensor::zeros({n_src, c});
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < c; ++j)
      serial.at<float>({rows.data<int64_t>()[i], j}) += r.at<float>({i, j});
  EXPECT_EQ(std::memcmp(serial.raw(), dsrc.raw(), dsrc.nbytes()), 0);
}

// Same inputs, same bits, whatever the thread count (sizes above the parallel thresholds).
TEST(ElementwiseBackward, SameBitsForAnyThreadCount) {
  std::mt19937 rng(7);
  const int64_t n = 301, c = 257;
  Tensor g = random_tensor({n, c}, rng);
  Tensor rows = Tensor::empty({n}, DType::kI64);
  for (int64_t i = 0; i < n; ++i) rows.data<int64_t>()[i] = (i * 7) % 50;
  expect_same_bits_for_any_thread_count([&](int) {
    Tensor db = Tensor::zeros({c}), ds = Tensor::zeros({50, c});
    add_bias_backward(host_exec(), g, db);
    gather_rows_backward(host_exec(), g, rows, ds);
    return std::vector<Tensor>{db, ds};
  });
}

}  // namespace
}  // namespace loom::gradcheck
