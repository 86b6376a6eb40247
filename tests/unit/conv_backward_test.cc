// causal_conv1d_backward against central differences of a double reference forward
// (tests/unit/gradcheck_support.h describes the method): gradients for x, the weight, the initial
// conv state, with and without SiLU, with a gradient arriving at the final state, sequences longer
// and shorter than the window, and no initial state at all.
//
// Bounds. A gradient element is a sum of at most W = 4 products of dpre (one exp-based silu' of
// the f32 pre-activation, itself a W-term sum) with weights; dweight sums T <= 9 such products.
// ~(2W + T + 8) u ~ 1.6e-6 worst case per element, ~sqrt of that count ~ 5 u = 3e-7 typically, and
// random data cancels only O(1): 1e-6 relative L2, ~8x the worst measured (1.2e-7).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/conv.h"
#include "tests/unit/gradcheck_support.h"

namespace loom::gradcheck {
namespace {

constexpr double kGradTol = 1e-6;
constexpr double kForwardTol = 1e-6;

// The forward in double: out [T, C], then the final state [W-1, C] appended.
std::vector<double> conv_ref(const std::vector<double>& x, const std::vector<double>& w,
                             const std::vector<double>& state, int64_t T, int64_t C, int64_t W,
                             bool silu) {
  const int64_t P = W - 1;
  auto xpad = [&](int64_t p, int64_t c) { return p < P ? state[p * C + c] : x[(p - P) * C + c]; };
  std::vector<double> out((T + P) * C);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0;
      for (int64_t j = 0; j < W; ++j) acc += w[c * W + j] * xpad(t + j, c);
      out[t * C + c] = silu ? acc / (1.0 + std::exp(-acc)) : acc;
    }
  }
  for (int64_t i = 0; i < P; ++i)
    for (int64_t c = 0; c < C; ++c) out[(T + i) * C + c] = xpad(T + i, c);
  return out;
}

struct ConvCase {
  int64_t T, C, W;
  bool silu;
  bool with_state;  // an initial state and a gradient at the final state; else both undefined
};

class ConvBackward : public ::testing::TestWithParam<ConvCase> {};

TEST_P(ConvBackward, MatchesFiniteDifferences) {
  const ConvCase k = GetParam();
  const int64_t T = k.T, C = k.C, W = k.W, P = W - 1;
  std::mt19937 rng(static_cast<unsigned>(T * 100 + C * 10 + W));
  Tensor x = random_tensor({T, C}, rng, -2.0f, 2.0f);
  Tensor w = random_tensor({C, W}, rng);
  Tensor state = k.with_state ? random_tensor({P, C}, rng, -2.0f, 2.0f) : Tensor::zeros({P, C});
  Tensor r = random_tensor({T, C}, rng);
  Tensor r_final = k.with_state ? random_tensor({P, C}, rng) : Tensor::zeros({P, C});
  std::vector<double> xd = to_double(x), wd = to_double(w), sd = to_double(state);
  auto j = [&] {
    const std::vector<double> out = conv_ref(xd, wd, sd, T, C, W, k.silu);
    double s = 0;
    for (int64_t i = 0; i < T * C; ++i) s += out[i] * r.data<float>()[i];
    for (int64_t i = 0; i < P * C; ++i) s += out[T * C + i] * r_final.data<float>()[i];
    return s;
  };

  Tensor conv_state = state.clone();
  Tensor out = Tensor::empty({T, C});
  causal_conv1d_forward(host_exec(), x, w, conv_state, k.silu, out);
  std::vector<double> ref = conv_ref(xd, wd, sd, T, C, W, k.silu);
  expect_forward_close("conv out", out, std::vector<double>(ref.begin(), ref.begin() + T * C),
                       kForwardTol);
  if (P > 0)
    expect_forward_close("conv final state", conv_state,
                         std::vector<double>(ref.begin() + T * C, ref.end()), 0.0);

  Tensor dx = Tensor::empty({T, C});
  Tensor dw = Tensor::zeros({C, W});
  Tensor ds = k.with_state ? Tensor::empty({P, C}) : Tensor();
  causal_conv1d_backward(host_exec(), x, w, k.with_state ? state : Tensor(), k.silu, r,
                         k.with_state ? r_final : Tensor(), dx, dw, ds);
  expect_grad_close(k.silu ? "conv+silu dx" : "conv dx", dx, central_diff(j, xd), kGradTol);
  expect_grad_close(k.silu ? "conv+silu dweight" : "conv dweight", dw, central_diff(j, wd),
                    kGradTol);
  if (k.with_state && P > 0)
    expect_grad_close(k.silu ? "conv+silu dinitial_state" : "conv dinitial_state", ds,
                      central_diff(j, sd), kGradTol);

  // dx may alias dout: the same bits; dweight is accumulated onto what it held.
  const Tensor base = random_tensor({C, W}, rng);
  Tensor alias = r.clone();
  Tensor dw2 = base.clone();
  causal_conv1d_backward(host_exec(), x, w, k.with_state ? state : Tensor(), k.silu, alias,
                         k.with_state ? r_final : Tensor(), alias, dw2, Tensor());
  EXPECT_EQ(std::memcmp(alias.raw(), dx.raw(), dx.nbytes()), 0);
  expect_accumulated("conv dweight", base, dw, dw2);
}

INSTANTIATE_TEST_SUITE_P(Cases, ConvBackward,
                         ::testing::Values(ConvCase{9, 5, 4, true, true},
                                           ConvCase{9, 5, 4, false, true},
                                           ConvCase{2, 7, 4, true, true},  // T < W - 1
                                           ConvCase{7, 3, 3, true, false},
                                           ConvCase{1, 5, 4, false, true},
                                           ConvCase{6, 5, 1, true, false}));  // no state at all

// Same inputs, same bits, whatever the thread count (sizes above the parallel threshold).
TEST(ConvBackward, SameBitsForAnyThreadCount) {
  std::mt19937 rng(9);
  const int64_t T = 301, C = 517, W = 4;
  Tensor x = random_tensor({T, C}, rng), w = random_tensor({C, W}, rng);
  Tensor s0 = random_tensor({W - 1, C}, rng), g = random_tensor({T, C}, rng);
  expect_same_bits_for_any_thread_count([&](int) {
    Tensor dx = Tensor::empty({T, C}), dw = Tensor::zeros({C, W}), ds = Tensor::empty({W - 1, C});
    causal_conv1d_backward(host_exec(), x, w, s0, true, g, Tensor(), dx, dw, ds);
    return std::vector<Tensor>{dx, dw, ds};
  });
}

}  // namespace
}  // namespace loom::gradcheck
