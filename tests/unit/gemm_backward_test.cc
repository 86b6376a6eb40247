// linear_backward against the products written out in double: d_x = beta d_x + d_out w and
// d_w += d_out^T x, at odd sizes, for both betas (d_w accumulates onto what it holds).
#include "kernels/gemm_backward.h"

#include <cmath>
#include <random>

#include "tests/unit/gradcheck_support.h"

namespace loom::gradcheck {
namespace {

TEST(LinearBackward, MatchesTheDoubleProducts) {
  std::mt19937 rng(4);
  // Each tensor draws from a fresh copy of the standard normal.
  const std::normal_distribution<float> normal(0.0f, 1.0f);
  auto random = [&](Shape s) { return random_tensor(std::move(s), rng, normal); };
  for (float beta : {0.0f, 1.0f}) {
    const int64_t M = 37, K = 19, N = 23;
    const Tensor x = random({M, K}), w = random({N, K}), dy = random({M, N});
    Tensor dx = random({M, K}), dw = random({N, K});
    const Tensor dx0 = dx.clone(), dw0 = dw.clone();
    linear_backward(host_exec(), x, w, dy, dx, beta, dw);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) {
        double want = beta * dx0.data<float>()[m * K + k];
        for (int64_t n = 0; n < N; ++n)
          want += double{dy.data<float>()[m * N + n]} * w.data<float>()[n * K + k];
        ASSERT_NEAR(dx.data<float>()[m * K + k], want, 1e-4 * (1 + std::fabs(want)));
      }
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        double want = dw0.data<float>()[n * K + k];
        for (int64_t m = 0; m < M; ++m)
          want += double{dy.data<float>()[m * N + n]} * x.data<float>()[m * K + k];
        ASSERT_NEAR(dw.data<float>()[n * K + k], want, 1e-4 * (1 + std::fabs(want)));
      }
  }
  // Without d_x only the weight gradient is formed.
  const Tensor x = random({3, 4}), w = random({5, 4}), dy = random({3, 5});
  Tensor dw = Tensor::zeros({5, 4});
  linear_backward(host_exec(), x, w, dy, Tensor(), 0.0f, dw);
  EXPECT_NE(dw.data<float>()[0], 0.0f);
}

}  // namespace
}  // namespace loom::gradcheck
