// causal_attention_forward against the serving kernel (gqa_attention_forward over a contiguous
// cache) and a double oracle; causal_attention_backward against central finite differences of
// the double oracle, for GQA groupings and MLA-like head sizes (d != dv), at odd lengths. The loss
// is a random projection of the output, L = sum(out * r).
#include "kernels/attention_backward.h"

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/attention.h"
#include "tests/unit/gradcheck_support.h"

namespace loom::gradcheck {
namespace {

struct Case {
  int64_t T, Hq, Hkv, d, dv;
};

std::vector<double> forward_double(const Case& c, const std::vector<double>& q,
                                   const std::vector<double>& k, const std::vector<double>& v,
                                   double scale) {
  std::vector<double> out(c.T * c.Hq * c.dv, 0.0), s(c.T);
  for (int64_t h = 0; h < c.Hq; ++h) {
    const int64_t hk = h / (c.Hq / c.Hkv);
    for (int64_t i = 0; i < c.T; ++i) {
      double m = -1e300, z = 0;
      for (int64_t j = 0; j <= i; ++j) {
        double dot = 0;
        for (int64_t x = 0; x < c.d; ++x)
          dot += q[(i * c.Hq + h) * c.d + x] * k[(j * c.Hkv + hk) * c.d + x];
        s[j] = scale * dot;
        m = std::max(m, s[j]);
      }
      for (int64_t j = 0; j <= i; ++j) z += (s[j] = std::exp(s[j] - m));
      for (int64_t j = 0; j <= i; ++j)
        for (int64_t x = 0; x < c.dv; ++x)
          out[(i * c.Hq + h) * c.dv + x] += s[j] / z * v[(j * c.Hkv + hk) * c.dv + x];
    }
  }
  return out;
}

// The central-difference step (central_diff's default is 1e-5).
constexpr double kH = 1e-6;

class CausalAttention : public ::testing::TestWithParam<Case> {};

// f32 softmax attention over at most 41 keys of O(1) scores: measured relative errors are ~1e-7
// (printed); 1e-5 leaves a wide margin and is far below what a missing term gives (the D_i
// correction or the scale in dk is O(1) relative).
constexpr double kTol = 1e-5;

TEST_P(CausalAttention, ForwardAndBackwardMatchTheDoubleOracle) {
  const Case c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.T * 17 + c.Hq * 5 + c.d));
  std::normal_distribution<double> normal(0.0, 1.0);
  auto random = [&](int64_t n) {
    std::vector<double> x(n);
    for (double& e : x) e = static_cast<float>(normal(rng));
    return x;
  };
  std::vector<double> q = random(c.T * c.Hq * c.d), k = random(c.T * c.Hkv * c.d),
                      v = random(c.T * c.Hkv * c.dv), r = random(c.T * c.Hq * c.dv);
  const double scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.d)));
  const Shape qs{c.T, c.Hq, c.d}, ks{c.T, c.Hkv, c.d}, vs{c.T, c.Hkv, c.dv}, os{c.T, c.Hq, c.dv};
  const Tensor tq = to_tensor(q, qs), tk = to_tensor(k, ks), tv = to_tensor(v, vs);

  Tensor out = Tensor::full(os, NAN), lse = Tensor::full({c.T, c.Hq}, NAN);
  causal_attention_forward(host_exec(), tq, tk, tv, static_cast<float>(scale), out, lse);
  EXPECT_LT(rel_l2(out, forward_double(c, q, k, v, scale)), kTol);
  // The serving kernel over the same keys as a contiguous cache gives the same outputs.
  Tensor serving = Tensor::empty(os);
  gqa_attention_forward(host_exec(), tq, CacheView::contiguous(tk), CacheView::contiguous(tv),
                        static_cast<float>(scale), serving);
  for (int64_t i = 0; i < out.numel(); ++i)
    ASSERT_NEAR(out.data<float>()[i], serving.data<float>()[i], 1e-5f) << i;

  Tensor dq = Tensor::full(qs, NAN), dk = Tensor::full(ks, NAN), dv = Tensor::full(vs, NAN);
  causal_attention_backward(host_exec(), tq, tk, tv, out, lse, to_tensor(r, os),
                            static_cast<float>(scale), dq, dk, dv);
  auto loss = [&]() {
    const std::vector<double> o = forward_double(c, q, k, v, scale);
    double l = 0;
    for (size_t i = 0; i < o.size(); ++i) l += o[i] * r[i];
    return l;
  };
  const double eq = rel_l2(dq, central_diff(loss, q, kH));
  const double ek = rel_l2(dk, central_diff(loss, k, kH));
  const double ev = rel_l2(dv, central_diff(loss, v, kH));
  std::printf("[attention backward] T=%lld Hq=%lld Hkv=%lld: dq %.3g dk %.3g dv %.3g\n",
              static_cast<long long>(c.T), static_cast<long long>(c.Hq),
              static_cast<long long>(c.Hkv), eq, ek, ev);
  EXPECT_LT(eq, kTol);
  EXPECT_LT(ek, kTol);
  EXPECT_LT(ev, kTol);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CausalAttention,
                         ::testing::Values(Case{1, 2, 1, 3, 2}, Case{7, 4, 2, 5, 3},
                                           Case{13, 3, 3, 6, 4}, Case{41, 2, 1, 4, 5}));

}  // namespace
}  // namespace loom::gradcheck
