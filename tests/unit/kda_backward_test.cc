// kda_recurrent_backward, kda_chunked_backward and kda_gate_backward against central finite
// differences of a double-precision forward written from the recurrence in kernels/kda.h (itself
// checked against Loom's f32 forward here), on tiny random inputs shaped as the model feeds them:
// L2-normalised q and k, bounded decays in [-5, 0] or softplus decays (down to ~-40 per token, so
// 16 tokens can decay by far more than 80 nats), beta in (0, 1), a non-zero initial state. The
// scalar loss is a random projection of the output and of the final state, so every gradient path
// is exercised:
//   L = sum(o * r_o) + sum(S_T * r_s).
#include "kernels/kda_backward.h"

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/kda.h"
#include "tests/unit/gradcheck_support.h"

namespace loom::gradcheck {
namespace {

struct Case {
  int64_t T, Hk, Hv, dk, dv;
  bool scalar_g;
  bool chunked = false;   // kda_chunked_backward instead of kda_recurrent_backward
  bool softplus = false;  // g = -exp(a) softplus(x) with a ~ N(0.5, 1), x ~ N(0, 2)
};

using BackwardFn = decltype(&kda_recurrent_backward);

struct Inputs {
  std::vector<double> q, k, v, g, beta, s0;
};

// o and the final state, in double.
void forward_double(const Case& c, const Inputs& in, double scale, std::vector<double>& out,
                    std::vector<double>& state) {
  const int64_t gw = c.scalar_g ? 1 : c.dk, group = c.Hv / c.Hk;
  out.assign(c.T * c.Hv * c.dv, 0.0);
  state = in.s0;
  std::vector<double> kv(c.dv);
  for (int64_t h = 0; h < c.Hv; ++h) {
    double* S = state.data() + h * c.dk * c.dv;
    const int64_t hk = h / group;
    for (int64_t t = 0; t < c.T; ++t) {
      const double* q = in.q.data() + (t * c.Hk + hk) * c.dk;
      const double* k = in.k.data() + (t * c.Hk + hk) * c.dk;
      const double* v = in.v.data() + (t * c.Hv + h) * c.dv;
      const double* g = in.g.data() + (t * c.Hv + h) * gw;
      const double b = in.beta[t * c.Hv + h];
      std::fill(kv.begin(), kv.end(), 0.0);
      for (int64_t i = 0; i < c.dk; ++i)
        for (int64_t j = 0; j < c.dv; ++j) {
          S[i * c.dv + j] *= std::exp(g[c.scalar_g ? 0 : i]);
          kv[j] += k[i] * S[i * c.dv + j];
        }
      for (int64_t i = 0; i < c.dk; ++i)
        for (int64_t j = 0; j < c.dv; ++j) S[i * c.dv + j] += k[i] * b * (v[j] - kv[j]);
      double* o = out.data() + (t * c.Hv + h) * c.dv;
      for (int64_t i = 0; i < c.dk; ++i)
        for (int64_t j = 0; j < c.dv; ++j) o[j] += scale * q[i] * S[i * c.dv + j];
    }
  }
}

// The inputs are rounded to f32 first, so the f32 kernel and the double oracle see the same values.
double round_f32(double x) { return static_cast<float>(x); }

// The central-difference step (central_diff's default is 1e-5).
constexpr double kH = 1e-6;

class KdaRecurrentBackward : public ::testing::TestWithParam<Case> {};

// f32 gradients through up to 130 reverse steps measure 4e-8 .. 2.2e-7 relative (printed); the
// finite differences in double with h = 1e-6 are good to ~1e-9. 1e-5 leaves a 45x margin yet is
// far below what any dropped term gives (a missing decay factor or beta path is O(1) relative).
constexpr double kTol = 1e-5;

TEST_P(KdaRecurrentBackward, MatchesFiniteDifferencesOfTheDoubleForward) {
  const Case c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.T * 131 + c.Hv * 7 + c.dk + c.softplus));
  const BackwardFn backward = c.chunked ? kda_chunked_backward : kda_recurrent_backward;
  std::normal_distribution<double> normal(0.0, 1.0);
  const int64_t gw = c.scalar_g ? 1 : c.dk;
  Inputs in;
  auto unit_rows = [&](std::vector<double>& x, int64_t rows, int64_t width) {
    x.resize(rows * width);
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < width; ++i) ss += (x[r * width + i] = normal(rng)) * x[r * width + i];
      for (int64_t i = 0; i < width; ++i)
        x[r * width + i] = round_f32(x[r * width + i] / std::sqrt(ss));
    }
  };
  unit_rows(in.q, c.T * c.Hk, c.dk);
  unit_rows(in.k, c.T * c.Hk, c.dk);
  for (int64_t i = 0; i < c.T * c.Hv * c.dv; ++i) in.v.push_back(round_f32(normal(rng)));
  for (int64_t i = 0; i < c.T * c.Hv * gw; ++i) {
    const double x = normal(rng);
    in.g.push_back(round_f32(c.softplus ? -std::exp(0.5 + normal(rng)) * std::log1p(std::exp(2 * x))
                                        : -5.0 / (1.0 + std::exp(-x))));
  }
  for (int64_t i = 0; i < c.T * c.Hv; ++i)
    in.beta.push_back(round_f32(1.0 / (1.0 + std::exp(-normal(rng)))));
  for (int64_t i = 0; i < c.Hv * c.dk * c.dv; ++i) in.s0.push_back(round_f32(0.5 * normal(rng)));
  std::vector<double> r_out(c.T * c.Hv * c.dv), r_state(c.Hv * c.dk * c.dv);
  for (double& x : r_out) x = round_f32(normal(rng));
  for (double& x : r_state) x = round_f32(normal(rng));
  const double scale = round_f32(1.0 / std::sqrt(static_cast<double>(c.dk)));

  const Shape qs{c.T, c.Hk, c.dk}, vs{c.T, c.Hv, c.dv}, gs{c.T, c.Hv, gw}, bs{c.T, c.Hv},
      ss{c.Hv, c.dk, c.dv};
  const Tensor q = to_tensor(in.q, qs), k = to_tensor(in.k, qs), v = to_tensor(in.v, vs),
               g = to_tensor(in.g, gs), beta = to_tensor(in.beta, bs), s0 = to_tensor(in.s0, ss);

  // The oracle computes Loom's recurrence.
  std::vector<double> out_ref, state_ref;
  forward_double(c, in, scale, out_ref, state_ref);
  Tensor out = Tensor::empty(vs), state = s0.clone();
  kda_recurrent_forward(host_exec(), q, k, v, g, beta, static_cast<float>(scale), state, out);
  ASSERT_LT(rel_l2(out, out_ref), 1e-5);
  ASSERT_LT(rel_l2(state, state_ref), 1e-5);

  Tensor dq = Tensor::full(qs, NAN), dk = Tensor::full(qs, NAN), dv = Tensor::full(vs, NAN),
         dg = Tensor::full(gs, NAN), dbeta = Tensor::full(bs, NAN), ds0 = Tensor::full(ss, NAN);
  backward(host_exec(), q, k, v, g, beta, static_cast<float>(scale), s0, to_tensor(r_out, vs),
           to_tensor(r_state, ss), dq, dk, dv, dg, dbeta, ds0);

  auto loss = [&]() {
    std::vector<double> o, s;
    forward_double(c, in, scale, o, s);
    double l = 0;
    for (size_t i = 0; i < o.size(); ++i) l += o[i] * r_out[i];
    for (size_t i = 0; i < s.size(); ++i) l += s[i] * r_state[i];
    return l;
  };
  const std::pair<const char*, std::pair<std::vector<double>*, const Tensor*>> grads[] = {
      {"q", {&in.q, &dq}}, {"k", {&in.k, &dk}},          {"v", {&in.v, &dv}},
      {"g", {&in.g, &dg}}, {"beta", {&in.beta, &dbeta}}, {"initial_state", {&in.s0, &ds0}}};
  for (const auto& [name, pair] : grads) {
    const std::vector<double> fd = central_diff(loss, *pair.first, kH);
    const double err = rel_l2(*pair.second, fd);
    std::printf("[kda backward] %s T=%lld Hv=%lld%s %s: rel L2 %.3g\n",
                c.chunked ? "chunked" : "recurrent", static_cast<long long>(c.T),
                static_cast<long long>(c.Hv), c.softplus ? " softplus" : "", name, err);
    EXPECT_LT(err, kTol) << name;
  }

  // Without the final state's gradient, and without asking for the initial state's.
  Tensor dq2 = Tensor::empty(qs);
  Tensor dk2 = Tensor::empty(qs), dv2 = Tensor::empty(vs), dg2 = Tensor::empty(gs),
         db2 = Tensor::empty(bs);
  backward(host_exec(), q, k, v, g, beta, static_cast<float>(scale), s0, to_tensor(r_out, vs),
           Tensor(), dq2, dk2, dv2, dg2, db2, Tensor());
  std::fill(r_state.begin(), r_state.end(), 0.0);
  EXPECT_LT(rel_l2(dv2, central_diff(loss, in.v, kH)), kTol);
}

INSTANTIATE_TEST_SUITE_P(Shapes, KdaRecurrentBackward,
                         ::testing::Values(Case{5, 1, 1, 3, 4, false}, Case{9, 2, 4, 5, 3, true},
                                           Case{7, 1, 3, 4, 2, false},
                                           // Crosses the 64-token replay segment.
                                           Case{70, 1, 2, 3, 2, false}, Case{130, 1, 1, 2, 3, true},
                                           // The chunked form: one partial chunk, several chunks
                                           // (scalar and per-channel decay, shared key heads),
                                           // and softplus decays whose 16-token spans exceed
                                           // 80 nats.
                                           Case{5, 1, 1, 3, 4, false, true},
                                           Case{70, 1, 2, 3, 2, false, true},
                                           Case{130, 1, 1, 2, 3, true, true},
                                           Case{75, 2, 4, 5, 3, true, true, true},
                                           Case{100, 1, 2, 9, 5, false, true, true},
                                           Case{40, 1, 1, 4, 3, false, false, true}));

TEST(KdaGateBackward, MatchesFiniteDifferencesInBothForms) {
  std::mt19937 rng(3);
  std::normal_distribution<double> normal(0.0, 1.0);
  const int64_t T = 11, H = 3, per_head = 5, width = H * per_head;
  for (float lower_bound : {0.0f, -5.0f}) {
    for (bool with_bias : {true, false}) {
      std::vector<double> f(T * width), a_log(H), bias(with_bias ? width : 0), r(T * width);
      for (double& x : f) x = round_f32(2.0 * normal(rng));
      for (double& x : a_log) x = round_f32(0.5 * normal(rng));
      for (double& x : bias) x = round_f32(normal(rng));
      for (double& x : r) x = round_f32(normal(rng));
      auto loss = [&]() {
        double l = 0;
        for (int64_t t = 0; t < T; ++t)
          for (int64_t c = 0; c < width; ++c) {
            const double x = f[t * width + c] + (with_bias ? bias[c] : 0.0);
            const double a = std::exp(a_log[c / per_head]);
            const double g = lower_bound == 0.0f ? -a * std::log1p(std::exp(x))
                                                 : lower_bound / (1.0 + std::exp(-a * x));
            l += g * r[t * width + c];
          }
        return l;
      };
      // d_f is written (poisoned first); the parameter gradients accumulate onto what they hold.
      Tensor d_f = Tensor::full({T, width}, NAN), d_a = Tensor::full({H}, 0.5f);
      Tensor d_b = with_bias ? Tensor::full({width}, -0.25f) : Tensor();
      kda_gate_backward(host_exec(), to_tensor(f, {T, width}), to_tensor(a_log, {H}),
                        with_bias ? to_tensor(bias, {width}) : Tensor(), lower_bound,
                        to_tensor(r, {T, width}), d_f, d_a, d_b);
      EXPECT_LT(rel_l2(d_f, central_diff(loss, f, kH)), 1e-5) << lower_bound;
      std::vector<double> fd_a = central_diff(loss, a_log, kH);
      for (double& x : fd_a) x += 0.5;
      EXPECT_LT(rel_l2(d_a, fd_a), 1e-5) << lower_bound;
      if (with_bias) {
        std::vector<double> fd_b = central_diff(loss, bias, kH);
        for (double& x : fd_b) x -= 0.25;
        EXPECT_LT(rel_l2(d_b, fd_b), 1e-5) << lower_bound;
      }
    }
  }
}

}  // namespace
}  // namespace loom::gradcheck
