// kda_chunked_backward against kda_recurrent_backward (itself checked against central differences
// in kda_backward_test.cc, as is the chunked form on small cases) on fresh random inputs: lengths
// that are not multiples of the 64-token chunk or the 16-token sub-chunk (1, 15, 71, 300, 1000),
// odd head sizes, key heads shared by value heads, per-channel (KDA) and per-head (GDN) decay,
// bounded and softplus gates, with and without an initial state and a final state's gradient.
// Then its memory: at T = 4096 the workspace it takes grows by one state per chunk, not per token;
// and its results do not depend on the thread count.
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/workspace.h"
#include "kernels/kda.h"
#include "kernels/kda_backward.h"
#include "tests/unit/gradcheck_support.h"

namespace loom {
namespace {

struct Case {
  int64_t T, Hk, Hv, dk, dv;
  bool scalar_g;    // GDN: one decay per value head
  bool softplus;    // g = -exp(a) softplus(x) (down to ~-40 per token); else bounded in (-5, 0)
  bool with_state;  // a non-zero initial state, d_final_state and d_initial_state
};

std::string name_of(const Case& c) {
  char buf[128];
  std::snprintf(buf, sizeof(buf), "T%lld_Hk%lld_Hv%lld_dk%lld_dv%lld_%s_%s_%s",
                static_cast<long long>(c.T), static_cast<long long>(c.Hk),
                static_cast<long long>(c.Hv), static_cast<long long>(c.dk),
                static_cast<long long>(c.dv), c.scalar_g ? "gdn" : "kda",
                c.softplus ? "softplus" : "bounded", c.with_state ? "state" : "nostate");
  return buf;
}

struct Problem {
  Tensor q, k, v, g, beta, s0, d_out, d_final;
  float scale;
};

Problem make_problem(const Case& c, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Problem p;
  auto unit_rows = [&](int64_t rows, int64_t width) {
    Tensor t = gradcheck::random_tensor({rows / c.Hk, c.Hk, width}, rng, normal);
    float* x = t.data<float>();
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < width; ++i) ss += double(x[r * width + i]) * x[r * width + i];
      for (int64_t i = 0; i < width; ++i) x[r * width + i] /= static_cast<float>(std::sqrt(ss));
    }
    return t;
  };
  p.q = unit_rows(c.T * c.Hk, c.dk);
  p.k = unit_rows(c.T * c.Hk, c.dk);
  p.v = gradcheck::random_tensor({c.T, c.Hv, c.dv}, rng, normal);
  p.g = Tensor::empty({c.T, c.Hv, c.scalar_g ? 1 : c.dk});
  for (int64_t i = 0; i < p.g.numel(); ++i) {
    const float x = normal(rng);
    p.g.data<float>()[i] = c.softplus ? -std::exp(0.5f + normal(rng)) * std::log1p(std::exp(2 * x))
                                      : -5.0f / (1.0f + std::exp(-x));
  }
  p.beta = gradcheck::random_tensor({c.T, c.Hv}, rng, 0.0f, 1.0f);
  p.s0 = c.with_state ? gradcheck::random_tensor({c.Hv, c.dk, c.dv}, rng, -0.5f, 0.5f)
                      : Tensor::zeros({c.Hv, c.dk, c.dv});
  p.d_out = gradcheck::random_tensor({c.T, c.Hv, c.dv}, rng, normal);
  if (c.with_state) p.d_final = gradcheck::random_tensor({c.Hv, c.dk, c.dv}, rng, normal);
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.dk));
  return p;
}

struct Grads {
  Tensor dq, dk, dv, dg, dbeta, ds0;
};

Grads run(decltype(&kda_recurrent_backward) backward, const Exec& ex, const Problem& p,
          bool want_ds0) {
  Grads r{Tensor::full(p.q.shape(), NAN),    Tensor::full(p.k.shape(), NAN),
          Tensor::full(p.v.shape(), NAN),    Tensor::full(p.g.shape(), NAN),
          Tensor::full(p.beta.shape(), NAN), want_ds0 ? Tensor::full(p.s0.shape(), NAN) : Tensor()};
  backward(ex, p.q, p.k, p.v, p.g, p.beta, p.scale, p.s0, p.d_out, p.d_final, r.dq, r.dk, r.dv,
           r.dg, r.dbeta, r.ds0);
  return r;
}

double rel_l2(const Tensor& got, const Tensor& ref) {
  return gradcheck::rel_l2(got, gradcheck::to_double(ref));
}

// Both forms are f32 with different summation orders (per token against per chunk GEMMs), so
// they differ by rounding: measured at most 8.3e-7 relative L2 over five runs of every case
// (printed, "[kda chunked backward]"; each form is within ~2e-7 of central differences in
// kda_backward_test). 1e-5 leaves a 12x margin; a missing or wrong term is O(1e-2) and more.
constexpr double kTol = 1e-5;

class KdaChunkedBackward : public ::testing::TestWithParam<Case> {};

TEST_P(KdaChunkedBackward, MatchesTheRecurrentBackward) {
  const Case c = GetParam();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const Problem p = make_problem(c, rng);
  const Grads ref = run(kda_recurrent_backward, host_exec(), p, c.with_state);
  const Grads got = run(kda_chunked_backward, host_exec(), p, c.with_state);
  const std::pair<const char*, std::pair<const Tensor*, const Tensor*>> pairs[] = {
      {"dq", {&got.dq, &ref.dq}},          {"dk", {&got.dk, &ref.dk}},
      {"dv", {&got.dv, &ref.dv}},          {"dg", {&got.dg, &ref.dg}},
      {"dbeta", {&got.dbeta, &ref.dbeta}}, {"ds0", {&got.ds0, &ref.ds0}}};
  for (const auto& [what, t] : pairs) {
    if (!t.first->defined()) continue;
    const double err = rel_l2(*t.first, *t.second);
    std::printf("[kda chunked backward] %s %s: rel L2 %.3g (seed %u)\n", name_of(c).c_str(), what,
                err, seed);
    EXPECT_LT(err, kTol) << what;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, KdaChunkedBackward,
    ::testing::Values(
        Case{1, 1, 1, 7, 5, false, false, true}, Case{1, 2, 4, 16, 8, true, true, false},
        Case{15, 1, 2, 13, 9, false, false, true}, Case{15, 2, 2, 8, 24, true, true, true},
        Case{71, 1, 1, 33, 17, false, true, true}, Case{71, 2, 6, 12, 20, true, false, false},
        Case{300, 1, 3, 64, 48, false, false, true}, Case{300, 2, 2, 40, 72, false, true, false},
        Case{300, 1, 2, 24, 16, true, true, true}, Case{1000, 1, 2, 128, 128, false, false, true},
        Case{1000, 2, 4, 32, 24, false, true, true}, Case{1000, 1, 1, 50, 30, true, false, false}),
    [](const ::testing::TestParamInfo<Case>& info) { return name_of(info.param); });

// The workspace the chunked backward takes is what kda_chunked_backward_workspace_bytes says (up to
// the workspace's 256-byte alignment), and between T = 64 and T = 4096 it grows by exactly one
// [dk, dv] state per value head per extra chunk (the chunk-boundary states): at T = 4096 that is
// 1/64 of what per-token states would take.
TEST(KdaChunkedBackwardMemory, KeepsOneStatePerChunkNotPerToken) {
  const int64_t Hk = 2, Hv = 2, d = 64;
  std::mt19937 rng(5);
  auto measured = [&](int64_t T) {
    const Problem p = make_problem(Case{T, Hk, Hv, d, d, false, false, true}, rng);
    Workspace ws(Device::kCpu);
    Exec ex = host_exec();
    ex.workspace = &ws;
    const Grads got = run(kda_chunked_backward, ex, p, true);
    const size_t expected = kda_chunked_backward_workspace_bytes(T, Hk, Hv, d, d);
    EXPECT_GE(ws.high_water(), expected);
    EXPECT_LT(ws.high_water(), expected + 256);
    if (T == 4096) {
      // The long case is also checked against the recurrence.
      const Grads ref = run(kda_recurrent_backward, host_exec(), p, true);
      EXPECT_LT(rel_l2(got.dq, ref.dq), kTol);
      EXPECT_LT(rel_l2(got.dk, ref.dk), kTol);
      EXPECT_LT(rel_l2(got.dv, ref.dv), kTol);
      EXPECT_LT(rel_l2(got.dg, ref.dg), kTol);
      EXPECT_LT(rel_l2(got.dbeta, ref.dbeta), kTol);
      EXPECT_LT(rel_l2(got.ds0, ref.ds0), kTol);
    }
    return expected;
  };
  const size_t state_bytes = Hv * d * d * sizeof(float);
  const size_t at_64 = measured(64), at_4096 = measured(4096);
  std::printf(
      "[kda chunked backward] workspace T=64: %zu bytes, T=4096: %zu bytes (per-token "
      "states would be %zu)\n",
      at_64, at_4096, 4096 * state_bytes);
  EXPECT_EQ(at_4096 - at_64, (4096 / kKdaChunk - 1) * state_bytes);
  EXPECT_LT(at_4096, 4096 * state_bytes / 32);
}

TEST(KdaChunkedBackwardDeterminism, SameBitsForAnyThreadCount) {
  std::mt19937 rng(11);
  const Problem p = make_problem(Case{150, 1, 3, 20, 12, false, true, true}, rng);
  gradcheck::expect_same_bits_for_any_thread_count([&](int) {
    const Grads g = run(kda_chunked_backward, host_exec(), p, true);
    return std::vector<Tensor>{g.dq, g.dk, g.dv, g.dg, g.dbeta, g.ds0};
  });
}

// The trainer's rule: the form the forward takes (short sequences and batch-invariant numerics
// take the recurrence), the same on every device (CUDA has its chunked twin,
// tests/gpu/kda_chunked_backward_cuda_test.cc); fla_kda_s0's and kimi_linear_s0's gradcheck
// prompt (150 tokens) takes the chunked form, so model_gradients_test runs it.
TEST(KdaBackwardDispatch, TheFormTheForwardTakesOnTheCpu) {
  Exec ex = host_exec();
  EXPECT_TRUE(kda_backward_takes_recurrence(ex, kKdaRecurrentMaxTokens));
  EXPECT_FALSE(kda_backward_takes_recurrence(ex, kKdaRecurrentMaxTokens + 1));
  EXPECT_FALSE(kda_backward_takes_recurrence(ex, 150));
  ex.batch_invariant = true;
  EXPECT_TRUE(kda_backward_takes_recurrence(ex, 150));
  ex.batch_invariant = false;
  ex.device = Device::cuda(0);
  EXPECT_FALSE(kda_backward_takes_recurrence(ex, 150));
}

}  // namespace
}  // namespace loom
