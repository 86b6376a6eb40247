// The trainer's optimizer pieces against double-precision references written from their
// definitions: AdamW as torch.optim.AdamW computes it (decoupled decay, bias corrections), the
// fixed-order sum of squares for global-norm clipping, and the warmup + cosine schedule.
#include "kernels/optim.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <numbers>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "trainer/lr_schedule.h"

namespace loom {
namespace {

TEST(AdamW, FollowsTorchsUpdateOverManySteps) {
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t n = 1037;
  Tensor p = Tensor::empty({n}), g = Tensor::empty({n}), m = Tensor::zeros({n}),
         v = Tensor::zeros({n});
  std::vector<double> rp(n), rm(n, 0.0), rv(n, 0.0);
  for (int64_t i = 0; i < n; ++i) rp[i] = p.data<float>()[i] = normal(rng);
  AdamWStep s;
  s.beta1 = 0.9f;
  s.beta2 = 0.95f;
  s.eps = 1e-8f;
  s.weight_decay = 0.1f;
  double worst = 0;
  for (int64_t step = 1; step <= 25; ++step) {
    s.step = step;
    s.lr = 1e-3f * static_cast<float>(step % 7 + 1);
    s.grad_scale = step % 3 == 0 ? 0.5f : 1.0f;
    for (int64_t i = 0; i < n; ++i) g.data<float>()[i] = normal(rng) * (i % 5 == 0 ? 1e-4f : 1.0f);
    adamw_update(host_exec(), s, p, g, m, v);
    // torch.optim.AdamW (single tensor, not amsgrad), in double.
    const double bc1 = 1 - std::pow(double{s.beta1}, step),
                 bc2 = 1 - std::pow(double{s.beta2}, step);
    for (int64_t i = 0; i < n; ++i) {
      const double gi = double{g.data<float>()[i]} * s.grad_scale;
      rp[i] *= 1 - double{s.lr} * s.weight_decay;
      rm[i] = s.beta1 * rm[i] + (1 - double{s.beta1}) * gi;
      rv[i] = s.beta2 * rv[i] + (1 - double{s.beta2}) * gi * gi;
      rp[i] -= s.lr / bc1 * rm[i] / (std::sqrt(rv[i]) / std::sqrt(bc2) + s.eps);
      worst = std::max(worst, std::fabs(rp[i] - p.data<float>()[i]));
    }
  }
  // 25 f32 updates of size <= lr = 7e-3 each, on weights of O(1): f32 rounding of the weight
  // (6e-8 per step) dominates; measured 1.05e-6. 4e-6 bounds it; a wrong bias correction or decay
  // order is off by >= 1e-4.
  std::printf("[adamw] worst |p - torch formula| after 25 steps: %.3g\n", worst);
  EXPECT_LT(worst, 4e-6);
}

TEST(AdamW, RejectsBadHyperparameters) {
  Tensor p = Tensor::zeros({3}), g = Tensor::zeros({3}), m = Tensor::zeros({3}),
         v = Tensor::zeros({3});
  AdamWStep s;
  s.step = 0;
  EXPECT_DEATH(adamw_update(host_exec(), s, p, g, m, v), "step 0");
  Tensor wrong = Tensor::zeros({4});
  s.step = 1;
  EXPECT_DEATH(adamw_update(host_exec(), s, p, wrong, m, v), "adamw_update");
}

TEST(AdamW, ClippedGradScaleIsTheMeanUnlessTheNormExceedsTheBound) {
  // norm = sqrt(400) * 0.25 = 5.
  EXPECT_EQ(clipped_grad_scale(400.0, 0.25, 0.0), 0.25);
  EXPECT_EQ(clipped_grad_scale(400.0, 0.25, 5.0), 0.25);
  EXPECT_DOUBLE_EQ(clipped_grad_scale(400.0, 0.25, 2.0), 0.25 * 2.0 / 5.0);
  EXPECT_EQ(clipped_grad_scale(0.0, 0.5, 1.0), 0.5);
}

// adamw_update_many against one adamw_update a tensor with the scale it describes: the same bits,
// with and without clipping, weight decay only where asked, more tensors than one GPU launch takes.
TEST(AdamW, ManyTensorsGiveTheBitsOfOneCallATensor) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<AdamWTensor> many, one;
  for (int i = 0; i < 70; ++i) {
    const int64_t n = std::vector<int64_t>{1, 7, 4096, 4097, 513}[i % 5] + i;
    AdamWTensor t{Tensor::empty({n}), Tensor::empty({n}), Tensor::empty({n}), Tensor::empty({n}),
                  i % 3 != 0};
    for (const Tensor* x : {&t.param, &t.grad, &t.m, &t.v})
      for (int64_t k = 0; k < n; ++k) x->data<float>()[k] = normal(rng);
    for (int64_t k = 0; k < n; ++k) t.v.data<float>()[k] = std::fabs(t.v.data<float>()[k]);
    many.push_back(t);
    one.push_back({t.param.clone(), t.grad, t.m.clone(), t.v.clone(), t.decay});
  }
  AdamWStep s;
  s.lr = 3e-3f;
  s.weight_decay = 0.1f;
  for (const double clip : {0.0, 1e9, 2.0}) {
    ++s.step;
    Tensor sum = Tensor::empty({1});
    sum.data<float>()[0] = 123.25f;
    const GradScale scale{.sum_squares = sum, .mean = 0.5, .clip_norm = clip};
    adamw_update_many(host_exec(), s, many, scale);
    AdamWStep each = s;
    each.grad_scale = static_cast<float>(clipped_grad_scale(123.25, 0.5, clip));
    EXPECT_EQ(each.grad_scale,
              clip == 2.0 ? static_cast<float>(0.5 * 2.0 / (std::sqrt(123.25) * 0.5)) : 0.5f);
    for (const AdamWTensor& t : one) {
      each.weight_decay = t.decay ? s.weight_decay : 0.0f;
      adamw_update(host_exec(), each, t.param, t.grad, t.m, t.v);
    }
    for (size_t i = 0; i < many.size(); ++i)
      for (auto [a, b] : {std::pair{&many[i].param, &one[i].param},
                          std::pair{&many[i].m, &one[i].m}, std::pair{&many[i].v, &one[i].v}})
        ASSERT_EQ(0, std::memcmp(a->raw(), b->raw(), a->nbytes()))
            << "tensor " << i << " clip " << clip;
  }
}

TEST(SumOfSquares, EqualsTheDoubleSumRoundedOnce) {
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int64_t n : {1, 4095, 4097, 300001}) {
    Tensor x = Tensor::empty({n});
    double want = 0;
    for (int64_t i = 0; i < n; ++i) {
      x.data<float>()[i] = normal(rng);
      want += double{x.data<float>()[i]} * x.data<float>()[i];
    }
    Tensor out = Tensor::empty({1});
    sum_of_squares(host_exec(), x, out);
    // Block partial sums in double: within a few double ulps of the sequential sum, so the f32
    // rounding of both agrees to 1 f32 ulp.
    EXPECT_NEAR(out.data<float>()[0], want, want * 1.2e-7) << n;
  }
}

TEST(LrSchedule, WarmsUpLinearlyThenFollowsTheCosine) {
  LrSchedule s{.peak_lr = 1e-3, .min_lr = 1e-4, .warmup_steps = 10, .total_steps = 110};
  ASSERT_TRUE(s.validate().ok());
  EXPECT_DOUBLE_EQ(s.at(1), 1e-4);
  EXPECT_DOUBLE_EQ(s.at(5), 5e-4);
  EXPECT_DOUBLE_EQ(s.at(10), 1e-3);
  // Halfway through the decay the cosine is at 0: the mean of peak and min.
  EXPECT_NEAR(s.at(60), 0.5 * (1e-3 + 1e-4), 1e-15);
  const double quarter = 1e-4 + 0.5 * 9e-4 * (1 + std::cos(std::numbers::pi * 0.25));
  EXPECT_NEAR(s.at(35), quarter, 1e-15);
  EXPECT_DOUBLE_EQ(s.at(110), 1e-4);
  EXPECT_DOUBLE_EQ(s.at(500), 1e-4);
  for (int64_t step = 11; step < 110; ++step) EXPECT_LE(s.at(step + 1), s.at(step)) << step;
  LrSchedule no_warmup{.peak_lr = 2e-3, .min_lr = 0, .warmup_steps = 0, .total_steps = 4};
  EXPECT_NEAR(no_warmup.at(1), 1e-3 * (1 + std::cos(std::numbers::pi * 0.25)), 1e-15);
}

TEST(LrSchedule, RejectsSchedulesThatMakeNoSense) {
  EXPECT_NE(LrSchedule({.peak_lr = 0}).validate().message().find("peak_lr"), std::string::npos);
  EXPECT_NE(LrSchedule({.peak_lr = 1e-3, .min_lr = 1e-2}).validate().message().find("min_lr"),
            std::string::npos);
  EXPECT_NE(
      LrSchedule({.warmup_steps = 5, .total_steps = 0}).validate().message().find("total_steps"),
      std::string::npos);
  EXPECT_NE(
      LrSchedule({.warmup_steps = 50, .total_steps = 10}).validate().message().find("warmup_steps"),
      std::string::npos);
}

}  // namespace
}  // namespace loom
