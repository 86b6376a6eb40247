// Finite-difference gradient checks for the kernel backward tests (tests/unit/*_backward_test.cc).
//
// The method, the same in every file: the op's forward is written again in double precision in the
// test (a reference forward, itself checked against the f32 kernel); the scalar J = sum(out * r)
// for a random projection r is differentiated by central differences of that double forward with
// respect to every input and parameter; the f32 backward kernel, given dout = r, must match those
// differences within a per-tensor relative L2 bound (||got - fd|| / ||fd||) that each test
// justifies. With h = 1e-5 on O(1) inputs the differences themselves are good to ~1e-9 relative
// (O(h^2) truncation, O(1e-16 * |J| / h) rounding), far below any f32 bound, so the measured error
// is the kernel's own f32 rounding. (The KDA and attention backward tests, which build their
// inputs as double vectors, take h = 1e-6.)
//
// The helpers below are the only copies: the backward tests, and tests/unit/gemm_backward_test.cc,
// take their random tensors, relative errors and differences from here.
#pragma once

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <concepts>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace loom::gradcheck {

// A new f32 tensor of `shape` filled in element order with draws of `dist` (any <random>
// distribution) from `rng`. `dist` is taken by value: every tensor starts from a fresh
// distribution state (normal_distribution caches its second draw).
template <typename Rng, std::invocable<Rng&> Dist>
Tensor random_tensor(Shape shape, Rng& rng, Dist dist) {
  Tensor t = Tensor::empty(std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(dist(rng));
  return t;
}

// Uniform in [lo, hi).
template <typename Rng>
Tensor random_tensor(Shape shape, Rng& rng, float lo = -1.0f, float hi = 1.0f) {
  return random_tensor(std::move(shape), rng, std::uniform_real_distribution<float>(lo, hi));
}

inline std::vector<double> to_double(const Tensor& t) {
  return std::vector<double>(t.data<float>(), t.data<float>() + t.numel());
}

// A new f32 tensor of `shape` holding `x` rounded to f32 (x.size() must be shape's numel).
inline Tensor to_tensor(const std::vector<double>& x, Shape shape) {
  Tensor t = Tensor::empty(std::move(shape));
  EXPECT_EQ(t.numel(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size() && i < static_cast<size_t>(t.numel()); ++i)
    t.data<float>()[i] = static_cast<float>(x[i]);
  return t;
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

// ||got - ref||_2 / ||ref||_2. A zero `ref` gives 0 when `got` is exactly zero too (a gradient
// that vanishes, such as dq over a single key) and infinity otherwise.
inline double rel_l2(const float* got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  if (den == 0) return num == 0 ? 0.0 : HUGE_VAL;
  return std::sqrt(num) / std::sqrt(den);
}
inline double rel_l2(const Tensor& got, const std::vector<double>& ref) {
  return rel_l2(got.data<float>(), ref);
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

// Runs `run(threads)` at 1, 2 and 3 OpenMP threads (the count is restored after) and expects every
// tensor it returns to hold the same bits at each count as at one thread. `run` allocates its
// outputs afresh each time and may make checks of its own.
inline void expect_same_bits_for_any_thread_count(
    const std::function<std::vector<Tensor>(int threads)>& run) {
  std::vector<std::pair<int, std::vector<Tensor>>> outs;
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    outs.emplace_back(threads, run(threads));
  }
  omp_set_num_threads(saved);
  const std::vector<Tensor>& one = outs[0].second;
  for (const auto& [threads, got] : outs) {
    ASSERT_EQ(got.size(), one.size());
    for (size_t k = 0; k < one.size(); ++k) {
      ASSERT_EQ(got[k].nbytes(), one[k].nbytes()) << "output " << k;
      EXPECT_EQ(std::memcmp(got[k].raw(), one[k].raw(), one[k].nbytes()), 0)
          << "output " << k << " at " << threads << " threads";
    }
  }
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
