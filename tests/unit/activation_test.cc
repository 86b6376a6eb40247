// silu_mul_forward and embedding_forward against double references.
#include "kernels/activation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace loom {
namespace {

Tensor random_tensor(Shape shape, std::mt19937& rng, float lo, float hi) {
  Tensor t = Tensor::empty(shape);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

// One f32 exp, one divide and two multiplies: a few ulps relative; 1e-6 relative + 1e-7
// absolute covers it (values span [-80, 80] so exp under/overflows are exercised too).
TEST(Activation, SiluMulMatchesDouble) {
  std::mt19937 rng(11);
  Tensor g = random_tensor({37, 129}, rng, -80.0f, 80.0f);
  Tensor u = random_tensor({37, 129}, rng, -3.0f, 3.0f);
  Tensor out = Tensor::empty({37, 129});
  silu_mul_forward(host_exec(), g, u, out);
  double max_rel = 0.0;
  for (int64_t i = 0; i < g.numel(); ++i) {
    const double gd = g.data<float>()[i];
    const double ref = gd / (1.0 + std::exp(-gd)) * u.data<float>()[i];
    const double err = std::abs(out.data<float>()[i] - ref);
    ASSERT_LE(err, 1e-6 * std::abs(ref) + 1e-7) << i << " g=" << gd;
    max_rel = std::max(max_rel, err / (std::abs(ref) + 1e-30));
  }
  std::printf("silu_mul max rel err %.3g\n", max_rel);
  // In place (out aliases gate) gives the same bits.
  Tensor g2 = g.clone();
  silu_mul_forward(host_exec(), g2, u, g2);
  for (int64_t i = 0; i < g.numel(); ++i) ASSERT_EQ(g2.data<float>()[i], out.data<float>()[i]);
}

TEST(Activation, ScalarHelpers) {
  EXPECT_FLOAT_EQ(sigmoidf(0.0f), 0.5f);
  EXPECT_FLOAT_EQ(siluf(1.0f), 1.0f / (1.0f + std::exp(-1.0f)));
  EXPECT_EQ(softplusf(25.0f), 25.0f);
  EXPECT_NEAR(softplusf(0.0f), std::log(2.0f), 1e-7);
}

template <typename Id>
void check_embedding(DType dt) {
  std::mt19937 rng(3);
  const int64_t v = 53, d = 71, t = 37;
  Tensor table = random_tensor({v, d}, rng, -1.0f, 1.0f);
  Tensor ids = Tensor::empty({t}, dt);
  std::uniform_int_distribution<int> pick(0, v - 1);
  for (int64_t i = 0; i < t; ++i) ids.data<Id>()[i] = static_cast<Id>(pick(rng));
  ids.data<Id>()[0] = 0;
  ids.data<Id>()[1] = static_cast<Id>(v - 1);
  Tensor out = Tensor::empty({t, d});
  embedding_forward(host_exec(), ids, table, out);
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = 0; j < d; ++j) {
      ASSERT_EQ(out.at<float>({i, j}), table.at<float>({int64_t{ids.data<Id>()[i]}, j}));
    }
  }
}

TEST(Activation, EmbeddingI32) { check_embedding<int32_t>(DType::kI32); }
TEST(Activation, EmbeddingI64) { check_embedding<int64_t>(DType::kI64); }

TEST(ActivationDeathTest, EmbeddingOutOfRangeAborts) {
  Tensor table = Tensor::zeros({10, 4});
  Tensor out = Tensor::empty({2, 4});
  Tensor ids = Tensor::empty({2}, DType::kI64);
  ids.data<int64_t>()[0] = 3;
  ids.data<int64_t>()[1] = 10;
  EXPECT_DEATH(embedding_forward(host_exec(), ids, table, out),
               "ids\\[1\\] = 10 outside \\[0, 10\\)");
  Tensor ids32 = Tensor::empty({1}, DType::kI32);
  ids32.data<int32_t>()[0] = -1;
  Tensor out1 = Tensor::empty({1, 4});
  EXPECT_DEATH(embedding_forward(host_exec(), ids32, table, out1), "outside");
}

}  // namespace
}  // namespace loom
