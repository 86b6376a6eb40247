// The bounds that tests/gpu/cuda_kernels_test.cc holds each CUDA kernel to against its CPU twin,
// why each is what it is, and the random inputs they were derived for. Shared with
// tests/gpu/cuda_tolerances_test.cc, which runs in every build (no GPU needed) and checks that a
// kernel dropping one element or using a slightly wrong scale would exceed them.
//
// Unless a bound says otherwise it applies to the scaled error
// max_i |got_i - ref_i| / max(1, max_i |ref_i|). eps is FLT_EPSILON (2^-23), u = eps / 2.
// "Observed" is the largest error over 13 random seeds on an H200 (2026-11-30,
// bench/results/gpu-h200.md).
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <random>

#include "core/tensor.h"
#include "kernels/elementwise.h"
#include "kernels/kda.h"
#include "kernels/norm.h"

namespace loom::twin {

constexpr double kEps = FLT_EPSILON;

// RMSNorm and L2 norm over rows of length d. The two sides accumulate the row's sum of squares of
// d positive terms in different orders (SIMD lanes vs a block tree). Rounding errors of such a sum
// behave like a random walk: its relative error is ~sqrt(d) u (Higham, Accuracy and Stability,
// the rule of thumb for recursive summation), so the two sides differ by ~sqrt(d) eps / 2 after
// the scale 1/sqrt(.) halves it, plus a few roundings of the scale, the products with x and w and
// the offset add (< 8 eps). Bound (sqrt(d) / 2 + 8) eps: 1.6e-6 at d = 129, 4.8e-6 at d = 4096;
// observed 1.8e-7 and 2.4e-7. Dropping one typical element of a row's sum of squares moves the
// row's scale by ~1 / (4 d) (5.6e-5 at d = 4096), dividing by d - 1 instead of d by 1 / (2 d).
inline double norm_tol(int64_t d) { return (std::sqrt(static_cast<double>(d)) / 2 + 8) * kEps; }

// GEMM, per element in condition units: |got - ref| / (|alpha| (|A||B|)_ij + |beta| |C_ij|).
// The worst case is ~K eps in those units, but the error of a length-K dot product is a sum of K
// roundings, each at most u times a partial sum; for zero-mean inputs the partial sums grow like
// sqrt(k) rms|a b| while (|A||B|)_ij grows like K E|a b|, so in condition units the error stays ~u
// for every K and every summation order (the blocked and tree orders of cuBLAS and of the GEMV
// kernel do better than sequential). Observed 2.2 eps (K = 129 to 1024, ~2000 elements per case);
// bound 16 eps. One dropped term a_ik b_kj is an error of |a_ik b_kj| / (|A||B|)_ij, ~1/K.
constexpr double kGemmTol = 16 * kEps;

// Recurrent KDA (and GDN), outputs and final state. Per token the outputs and the state update are
// length-dk dot products of O(1) terms (|q| = |k| = 1) summed in different orders on the two
// sides: ~sqrt(dk) eps apart. With beta in (0, 1), |k| = 1 and decay factors <= 1, each token's map
// S -> diag(e^g) (I - beta k k^T) S is non-expansive, so older errors are damped rather than
// amplified; the observed error does not grow with T (1.5e-7 = 1.25 eps at most, T = 1 to 500).
// Bound (sqrt(dk) + 8) eps, 1.7e-6 to 2.9e-6 (11x to 19x the observed error). kda_inputs gives
// outputs of ~0.02 at most and states below 1, so the scaled error is an absolute one: a 0.1%
// wrong scale (2e-5 at dk = 256) or one dropped key element exceeds the bound, where the former
// bound, 2e-4, let a 1% wrong scale through.
inline double kda_tol(int64_t dk) { return (std::sqrt(static_cast<double>(dk)) + 8) * kEps; }

inline Tensor randn(std::mt19937_64& rng, Shape shape, float scale = 1.0f, float mean = 0.0f) {
  Tensor t = Tensor::empty(shape);
  std::normal_distribution<float> nd(mean, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = nd(rng);
  return t;
}

inline Tensor uniform(std::mt19937_64& rng, Shape shape, float lo, float hi) {
  Tensor t = Tensor::empty(shape);
  std::uniform_real_distribution<float> ud(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = ud(rng);
  return t;
}

// max |got - ref| / max(1, max |ref|) of two host tensors; infinite if anything is NaN or the
// shapes differ.
inline double scaled_err(const Tensor& got, const Tensor& ref) {
  if (got.shape() != ref.shape()) return INFINITY;
  double maxref = 1.0, maxdiff = 0.0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double g = got.data<float>()[i], r = ref.data<float>()[i];
    if (!std::isfinite(g) || !std::isfinite(r)) return INFINITY;
    maxref = std::max(maxref, std::fabs(r));
    maxdiff = std::max(maxdiff, std::fabs(g - r));
  }
  return maxdiff / maxref;
}

struct KdaCase {
  int64_t T, Hk, Hv, dk, dv;
  bool scalar_g, softplus;
};

// Random host inputs of one case, drawn as the kernel's contract expects (unit q and k, beta in
// (0, 1), gates from kda_gate_forward).
struct KdaInputs {
  Tensor q, k, v, g, beta, s0;
  float scale;
};

inline KdaInputs kda_inputs(std::mt19937_64& rng, const KdaCase& c) {
  const int64_t gw = c.scalar_g ? 1 : c.dk;
  KdaInputs in;
  in.q = randn(rng, {c.T, c.Hk, c.dk});
  in.k = randn(rng, {c.T, c.Hk, c.dk});
  l2norm_forward(host_exec(), in.q, 1e-6f, 1.0f, in.q);
  l2norm_forward(host_exec(), in.k, 1e-6f, 1.0f, in.k);
  in.v = randn(rng, {c.T, c.Hv, c.dv});
  const Tensor f = randn(rng, {c.T, c.Hv * gw}, 2.0f);
  const Tensor A_log = uniform(rng, {c.Hv}, -2.0f, 0.5f);
  Tensor g2 = Tensor::empty(f.shape());
  kda_gate_forward(host_exec(), f, A_log, Tensor(), c.softplus ? 0.0f : -5.0f, g2);
  in.g = g2.reshape({c.T, c.Hv, gw});
  in.beta = randn(rng, {c.T, c.Hv});
  sigmoid_inplace(host_exec(), in.beta);
  in.s0 = randn(rng, {c.Hv, c.dk, c.dv}, 0.1f);
  in.scale = 1.0f / std::sqrt(static_cast<float>(c.dk));
  return in;
}

}  // namespace loom::twin
