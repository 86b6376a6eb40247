// Finite-difference gradient checks for the kernel backward tests (tests/unit/*_backward_test.cc).
//
// The method, the same in every file: the op's forward is written again in double precision in the
// test (a reference forward, itself checked against the f32 kernel); the scalar J = sum(out * r)
// for a random projection r is differentiated by central differences of that double forward with
// respect to every input and parameter; the f32 backward kernel, given dout = r, must match those
// differences within a per-tensor relative L2 bound (||got - fd|| / ||fd||) that each test
// justifies. With h = 1e-5 on O(1) inputs the differences themselves are good to ~1e-9 relative
// (O(h^2) truncation, O(1e-16 * |J| / h) rounding), far below any f32 bound, so the measured error
// is the kernel's own f32 rounding.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "core/tensor.h"

namespace loom::gradcheck {

inline Tensor random_tensor(Shape shape, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = Tensor::empty(shape);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

inline std::vector<double> to_double(const Tensor& t) {
  return std::vector<double>(t.data<float>(), t.data<float>() + t.numel());
}

// Central differences of f, which reads `x`: g[i] = (f(x + h e_i) - f(x - h e_i)) / 2h. x is
// restored on return.
inline std::vector<double> central_diff(const std::function<double()>& f, std::vector<double>& x,
                                        double h = 1e-5) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double up = f();
    x[i] = keep - h;
    const double down = f();
    x[i] = keep;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

// ||got - ref||_2 / ||ref||_2.
inline double rel_l2(const float* got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num) / std::sqrt(den);
}

// Asserts rel_l2(got, ref) <= bound and prints the measured error (grep "[gradcheck]").
inline void expect_grad_close(const char* what, const Tensor& got, const std::vector<double>& ref,
                              double bound) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(ref.size())) << what;
  double ref_norm = 0;
  for (double v : ref) ref_norm += v * v;
  ASSERT_GT(ref_norm, 0.0) << what << ": the reference gradient is zero, the check is empty";
  const double err = rel_l2(got.data<float>(), ref);
  std::printf("[gradcheck] %-40s rel L2 %.3e (bound %.1e)\n", what, err, bound);
  EXPECT_LE(err, bound) << what;
}

// A parameter gradient is accumulated: `after` (the op run onto `base`) must be exactly
// base + zero_based (the op run onto zeros) in f32, for ops that add one finished sum per element.
inline void expect_accumulated(const char* what, const Tensor& base, const Tensor& zero_based,
                               const Tensor& after) {
  ASSERT_EQ(after.numel(), base.numel()) << what;
  for (int64_t i = 0; i < after.numel(); ++i)
    ASSERT_EQ(after.data<float>()[i], base.data<float>()[i] + zero_based.data<float>()[i])
        << what << " at " << i;
}

// sum(out * r) in double.
inline double project(const std::vector<double>& out, const Tensor& r) {
  double s = 0;
  for (size_t i = 0; i < out.size(); ++i) s += out[i] * r.data<float>()[i];
  return s;
}

// Asserts the f32 kernel's forward equals the double reference (relative L2 <= bound), so that the
// differences are taken of the function the kernel computes.
inline void expect_forward_close(const char* what, const Tensor& got,
                                 const std::vector<double>& ref, double bound) {
  const double err = rel_l2(got.data<float>(), ref);
  std::printf("[gradcheck] %-40s forward rel L2 %.3e (bound %.1e)\n", what, err, bound);
  EXPECT_LE(err, bound) << what << " forward";
}

}  // namespace loom::gradcheck
