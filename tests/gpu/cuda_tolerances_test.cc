// The CUDA twin tolerances bite (tests/gpu/twin_tolerances.h): CPU-only checks that a kernel
// dropping one element or using a slightly wrong scale would exceed the bound that
// tests/gpu/cuda_kernels_test.cc holds it to. Nothing here touches a GPU, so it runs in every build
// (tests/CMakeLists.txt), `make test` included. The broken results are computed from the CPU
// twin's correct one on the same random inputs as the GPU test; each check prints
// "TOLCHECK <name> <error of the broken result> <bound>" (tests/gpu/run.sh tabulates them). Inputs
// come from seed 1, or LOOM_TEST_SEED when set; the margins are 7x or more on every seed tried.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernels/gemm.h"
#include "kernels/kda.h"
#include "kernels/norm.h"
#include "tests/gpu/twin_tolerances.h"

namespace loom {
namespace {

std::mt19937_64 seeded_rng() {
  const char* env = std::getenv("LOOM_TEST_SEED");
  const uint64_t seed = env != nullptr && *env != '\0' ? std::strtoull(env, nullptr, 10) : 1;
  std::printf("test seed %llu (LOOM_TEST_SEED=%llu replays it)\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  return std::mt19937_64(seed);
}

void expect_exceeds(const std::string& name, double err, double tol) {
  std::printf("TOLCHECK %s %.3e %.3e\n", name.c_str(), err, tol);
  std::fflush(stdout);
  EXPECT_GT(err, tol) << name << ": a broken kernel would pass";
}

TEST(CudaTolerances, RmsNormBoundCatchesDroppedElementAndWrongScale) {
  std::mt19937_64 rng = seeded_rng();
  for (int64_t D : {129, 4096}) {
    const int64_t N = 37;
    const Tensor x = twin::randn(rng, {N, D}, 2.0f), w = twin::randn(rng, {D}, 0.5f);
    Tensor ref = Tensor::empty({N, D});
    rmsnorm_forward(host_exec(), x, w, 1e-6f, 0.0f, ref);
    // Per row: the element of median |x| left out of the sum of squares, or the mean taken over
    // D - 1; both rescale the row of the correct output.
    Tensor dropped = ref.clone(), wrong_mean = ref.clone();
    for (int64_t r = 0; r < N; ++r) {
      const float* xr = x.data<float>() + r * D;
      std::vector<double> sq(xr, xr + D);
      double ss = 0.0;
      for (double& v : sq) ss += (v = v * v);
      std::nth_element(sq.begin(), sq.begin() + D / 2, sq.end());
      const double f_drop = std::sqrt(ss / (ss - sq[D / 2]));
      const double f_mean = std::sqrt(static_cast<double>(D - 1) / static_cast<double>(D));
      for (int64_t i = 0; i < D; ++i) {
        dropped.data<float>()[r * D + i] =
            static_cast<float>(ref.data<float>()[r * D + i] * f_drop);
        wrong_mean.data<float>()[r * D + i] =
            static_cast<float>(ref.data<float>()[r * D + i] * f_mean);
      }
    }
    expect_exceeds("rmsnorm_dropped_element_D" + std::to_string(D), twin::scaled_err(dropped, ref),
                   twin::norm_tol(D));
    expect_exceeds("rmsnorm_mean_over_D-1_D" + std::to_string(D), twin::scaled_err(wrong_mean, ref),
                   twin::norm_tol(D));
  }
}

TEST(CudaTolerances, GemmBoundCatchesDroppedTerm) {
  std::mt19937_64 rng = seeded_rng();
  for (int64_t K : {129, 1024}) {
    const int64_t M = 37, N = 61, k0 = K / 2;
    const Tensor a = twin::randn(rng, {M, K}), b = twin::randn(rng, {K, N});
    Tensor ref = Tensor::empty({M, N}), cond = Tensor::empty({M, N});
    matmul(host_exec(), a, false, b, false, ref, 1.0f, 0.0f);
    Tensor absa = a.clone(), absb = b.clone();
    for (int64_t i = 0; i < absa.numel(); ++i) {
      absa.data<float>()[i] = std::fabs(a.data<float>()[i]);
    }
    for (int64_t i = 0; i < absb.numel(); ++i) {
      absb.data<float>()[i] = std::fabs(b.data<float>()[i]);
    }
    matmul(host_exec(), absa, false, absb, false, cond, 1.0f, 0.0f);
    // Leaving term k0 out of every dot product: the error is |a_i,k0 b_k0,j| in condition units.
    double err = 0.0;
    for (int64_t i = 0; i < M; ++i) {
      for (int64_t j = 0; j < N; ++j) {
        const double term =
            static_cast<double>(a.data<float>()[i * K + k0]) * b.data<float>()[k0 * N + j];
        err = std::max(err, std::fabs(term) / cond.data<float>()[i * N + j]);
      }
    }
    expect_exceeds("gemm_dropped_term_K" + std::to_string(K), err, twin::kGemmTol);
  }
}

TEST(CudaTolerances, KdaBoundCatchesWrongScale) {
  std::mt19937_64 rng = seeded_rng();
  for (const twin::KdaCase& c : {twin::KdaCase{500, 2, 4, 64, 72, false, false},
                                 twin::KdaCase{61, 2, 2, 256, 256, false, true}}) {
    const twin::KdaInputs in = twin::kda_inputs(rng, c);
    Tensor s1 = in.s0.clone(), o1 = Tensor::empty({c.T, c.Hv, c.dv});
    kda_recurrent_forward(host_exec(), in.q, in.k, in.v, in.g, in.beta, in.scale, s1, o1);
    Tensor s2 = in.s0.clone(), o2 = Tensor::empty({c.T, c.Hv, c.dv});
    kda_recurrent_forward(host_exec(), in.q, in.k, in.v, in.g, in.beta, in.scale * (1.0f + 1e-3f),
                          s2, o2);
    expect_exceeds("kda_scale_1e-3_dk" + std::to_string(c.dk), twin::scaled_err(o2, o1),
                   twin::kda_tol(c.dk));
    // One element of one key left out (k[T/2, 0, 0] = 0): changes that token's state update and
    // its output (the final state may have decayed it away).
    Tensor k3 = in.k.clone();
    k3.data<float>()[(c.T / 2) * c.Hk * c.dk] = 0.0f;
    Tensor s3 = in.s0.clone(), o3 = Tensor::empty({c.T, c.Hv, c.dv});
    kda_recurrent_forward(host_exec(), in.q, k3, in.v, in.g, in.beta, in.scale, s3, o3);
    expect_exceeds("kda_dropped_key_element_dk" + std::to_string(c.dk), twin::scaled_err(o3, o1),
                   twin::kda_tol(c.dk));
  }
}

}  // namespace
}  // namespace loom
