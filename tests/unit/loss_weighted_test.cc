// The row-weighted fused cross-entropy (kernels/loss.h, row_weight: a policy gradient's per-token
// weights, trainer/rl) and Model::loss_and_gradients with row_weights:
// - the kernel against a direct double-precision weighted softmax cross-entropy, whose gradient is
//   itself checked by central differences; weights of both signs and zeros, over both chunkings;
// - weights all 1 / count give the unweighted mean's loss and gradients;
// - the model: weights 1 / scored give the masked mean's loss and gradients; and the GRPO
//   objective's gradient through the model (trainer/rl/policy_loss.h) matches central differences
//   of the objective along the gradient, parameters moved in place.
// Bounds are those of loss_backward_test.cc (same arithmetic, a weight per row instead of 1 /
// count).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "engine/model/model.h"
#include "kernels/loss.h"
#include "tests/unit/engine_test_support.h"
#include "tests/unit/gradcheck_support.h"
#include "trainer/rl/policy_loss.h"
#include "weights/model_config.h"
#include "weights/weight_loader.h"

namespace loom::gradcheck {
namespace {

constexpr int64_t kIgnore = -100;

struct Reference {
  double loss = 0;
  std::vector<double> dhidden, dlm_head;
};

// sum_t w_t (lse_t - logit_t[y_t]) over counted rows, every logit in double.
Reference weighted_ref(const std::vector<double>& h, const std::vector<double>& w,
                       const std::vector<int64_t>& y, const std::vector<double>& rw, int64_t v,
                       int64_t d, double scale) {
  const int64_t t_count = static_cast<int64_t>(y.size());
  Reference ref;
  ref.dhidden.assign(t_count * d, 0.0);
  ref.dlm_head.assign(v * d, 0.0);
  std::vector<double> logits(v);
  for (int64_t t = 0; t < t_count; ++t) {
    if (y[t] == kIgnore) continue;
    double mx = -INFINITY;
    for (int64_t j = 0; j < v; ++j) {
      double s = 0;
      for (int64_t k = 0; k < d; ++k) s += h[t * d + k] * w[j * d + k];
      logits[j] = s;
      mx = std::max(mx, s);
    }
    double z = 0;
    for (int64_t j = 0; j < v; ++j) z += std::exp(logits[j] - mx);
    const double lse = mx + std::log(z);
    ref.loss += rw[t] * (lse - logits[y[t]]);
    for (int64_t j = 0; j < v; ++j) {
      const double g = (std::exp(logits[j] - lse) - (j == y[t])) * scale * rw[t];
      for (int64_t k = 0; k < d; ++k) {
        ref.dhidden[t * d + k] += g * w[j * d + k];
        ref.dlm_head[j * d + k] += g * h[t * d + k];
      }
    }
  }
  return ref;
}

struct Problem {
  Tensor hidden, lm_head, targets, weights;
  std::vector<int64_t> y;
  std::vector<double> rw;
};

Problem make_problem(int64_t t_count, int64_t v, int64_t d, unsigned seed) {
  std::mt19937 rng(seed);
  Problem p;
  p.hidden = random_tensor({t_count, d}, rng, -1.0f, 1.0f);
  const float a = 2.0f / std::sqrt(static_cast<float>(d));
  p.lm_head = random_tensor({v, d}, rng, -a, a);
  p.targets = Tensor::empty({t_count}, DType::kI64);
  p.weights = Tensor::empty({t_count});
  std::uniform_int_distribution<int64_t> pick(0, v - 1);
  std::uniform_real_distribution<float> weight(-1.0f, 1.0f);
  for (int64_t t = 0; t < t_count; ++t) {
    const int64_t y = t % 7 == 3 ? kIgnore : pick(rng);
    // Every fifth row weighs 0 (a token whose clipped branch is active).
    const float rw = t % 5 == 1 ? 0.0f : weight(rng);
    p.y.push_back(y);
    p.targets.data<int64_t>()[t] = y;
    p.weights.data<float>()[t] = rw;
    p.rw.push_back(rw);
  }
  return p;
}

TEST(WeightedCrossEntropy, MatchesDirectDoubleWeightedSum) {
  // 330 x 5003: 2 row chunks by 2 vocabulary chunks, the last partial.
  for (const auto& [t, v, d, scale] :
       {std::tuple{9, 11, 7, 1.0f}, std::tuple{330, 5003, 37, 0.5f}}) {
    Problem p = make_problem(t, v, d, static_cast<unsigned>(t + v));
    const Reference ref =
        weighted_ref(to_double(p.hidden), to_double(p.lm_head), p.y, p.rw, v, d, scale);
    Tensor loss = Tensor::empty({1}), row_loss = Tensor::full({t}, NAN);
    Tensor dhidden = Tensor::full({t, d}, NAN), dlm_head = Tensor::zeros({v, d});
    cross_entropy_forward_backward(host_exec(), p.hidden, p.lm_head, p.targets, kIgnore, scale,
                                   loss, row_loss, dhidden, dlm_head, p.weights);
    const double loss_err = std::abs(loss.data<float>()[0] - ref.loss);
    std::printf("[weighted ce] T %d V %d: loss %.6f vs %.6f\n", t, v, loss.data<float>()[0],
                ref.loss);
    // The weighted sum cancels (weights of both signs): bound the absolute error by 1e-6 of
    // sum |w_t| l_t.
    double abs_sum = 0;
    for (int i = 0; i < t; ++i) abs_sum += std::abs(p.rw[i]) * row_loss.data<float>()[i];
    EXPECT_LE(loss_err, 1e-6 * abs_sum);
    expect_grad_close("weighted ce dhidden", dhidden, ref.dhidden, 1e-5);
    expect_grad_close("weighted ce dlm_head", dlm_head, ref.dlm_head, 1e-5);
    for (int64_t r = 0; r < t; ++r)
      if (p.rw[r] == 0.0f)
        for (int64_t k = 0; k < d; ++k) ASSERT_EQ(dhidden.data<float>()[r * d + k], 0.0f);
  }
}

TEST(WeightedCrossEntropy, OracleGradientMatchesCentralDifferences) {
  Problem p = make_problem(6, 9, 5, 3);
  std::vector<double> h = to_double(p.hidden), w = to_double(p.lm_head);
  const Reference ref = weighted_ref(h, w, p.y, p.rw, 9, 5, 1.0);
  auto f = [&] { return weighted_ref(h, w, p.y, p.rw, 9, 5, 1.0).loss; };
  const std::vector<double> gh = central_diff(f, h), gw = central_diff(f, w);
  for (size_t i = 0; i < gh.size(); ++i) EXPECT_NEAR(gh[i], ref.dhidden[i], 1e-8);
  for (size_t i = 0; i < gw.size(); ++i) EXPECT_NEAR(gw[i], ref.dlm_head[i], 1e-8);
}

TEST(WeightedCrossEntropy, WeightsOfOneOverCountGiveTheMean) {
  Problem p = make_problem(41, 4099, 13, 5);
  int64_t counted = 0;
  for (int64_t y : p.y) counted += y != kIgnore;
  for (int64_t t = 0; t < 41; ++t) p.weights.data<float>()[t] = 1.0f / static_cast<float>(counted);
  auto run = [&](const Tensor& weights) {
    Tensor loss = Tensor::empty({1}), dh = Tensor::zeros({41, 13}), dw = Tensor::zeros({4099, 13});
    cross_entropy_forward_backward(host_exec(), p.hidden, p.lm_head, p.targets, kIgnore, 1.0f, loss,
                                   Tensor(), dh, dw, weights);
    return std::tuple{loss.data<float>()[0], dh, dw};
  };
  const auto [mean_loss, mean_dh, mean_dw] = run(Tensor());
  const auto [w_loss, w_dh, w_dw] = run(p.weights);
  std::printf("[weighted ce] mean %.9g, weights 1/%lld %.9g\n", mean_loss, (long long)counted,
              w_loss);
  EXPECT_NEAR(w_loss, mean_loss, 1e-6 * mean_loss);
  expect_grad_close("1/count dhidden", w_dh, to_double(mean_dh), 1e-6);
  expect_grad_close("1/count dlm_head", w_dw, to_double(mean_dw), 1e-6);
}

// A synthetic KDA model with dense FFNs (the plain model of model_gradients_test.cc).
std::unique_ptr<Model> tiny_model() {
  auto cfg = load_model_config(loom::testing::kFixtures + "/kimi_linear_s1");
  EXPECT_TRUE(cfg.ok()) << cfg.status();
  for (MixerType& m : cfg->mixers) m = MixerType::kKda;
  for (FfnType& f : cfg->ffns) f = FfnType::kDense;
  cfg->attnres_block_size = 0;
  WeightLoader w = WeightLoader::synthetic(*cfg, 5);
  // Trainable: writable parameters (the policy-gradient check moves them in place).
  auto model = Model::load(*cfg, w, Placement{.trainable = true});
  EXPECT_TRUE(model.ok()) << model.status();
  return std::move(model).value();
}

std::vector<int32_t> tokens_for(const Model& model, int n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> tok(0, model.config().vocab_size - 1);
  std::vector<int32_t> tokens(n);
  for (int32_t& t : tokens) t = tok(rng);
  return tokens;
}

TEST(WeightedModelLoss, WeightsOfOneOverScoredGiveTheMaskedMean) {
  auto model = tiny_model();
  const std::vector<int32_t> tokens = tokens_for(*model, 23, 2);
  std::vector<uint8_t> mask(23, 1);
  for (int t = 0; t < 23; t += 3) mask[t] = 0;
  mask[22] = 0;
  int scored = 0;
  for (int t = 0; t + 1 < 23; ++t) scored += mask[t];
  std::vector<float> weights(23, 1.0f / static_cast<float>(scored));
  Gradients mean_grads, weighted_grads;
  auto mean = model->loss_and_gradients(tokens, mean_grads, mask);
  auto weighted = model->loss_and_gradients(tokens, weighted_grads, mask, nullptr, weights);
  ASSERT_TRUE(mean.ok()) << mean.status();
  ASSERT_TRUE(weighted.ok()) << weighted.status();
  std::printf("[weighted model] masked mean %.9g, weights 1/%d %.9g\n", *mean, scored, *weighted);
  EXPECT_NEAR(*weighted, *mean, 1e-6 * *mean);
  int compared = 0;
  for (const std::string& name : mean_grads.names()) {
    const Tensor* other = weighted_grads.find(name);
    ASSERT_NE(other, nullptr) << name;
    expect_grad_close(name.c_str(), *other, to_double(*mean_grads.find(name)), 1e-5);
    ++compared;
  }
  EXPECT_GT(compared, 10);
  // A wrong weight count is refused.
  std::vector<float> short_weights(5, 1.0f);
  Gradients unused;
  EXPECT_FALSE(model->loss_and_gradients(tokens, unused, mask, nullptr, short_weights).ok());
}

// The GRPO objective L(theta) over two trajectories (one positive, one negative advantage; old
// logprobs a little off so that ratios differ from 1 and some tokens clip), its gradient from
// accumulate_policy_gradient, and central differences of L along the unit gradient of one
// parameter tensor moved in place.
TEST(WeightedModelLoss, PolicyGradientMatchesCentralDifferencesOfTheObjective) {
  auto model = tiny_model();
  GrpoOptions o;
  o.kl_coef = 0.05;
  std::vector<Trajectory> trs(2);
  std::mt19937 rng(11);
  std::normal_distribution<float> jitter(0.0f, 0.15f);
  for (int k = 0; k < 2; ++k) {
    Trajectory& tr = trs[k];
    tr.tokens = tokens_for(*model, 19, 20 + k);
    tr.sampled.assign(19, 0);
    for (int t = 6; t < 18; ++t) tr.sampled[t] = 1;
    auto logp = token_logprobs(*model, tr.tokens);
    ASSERT_TRUE(logp.ok()) << logp.status();
    tr.old_logp = tr.behav_logp = tr.ref_logp = *logp;
    for (int t = 0; t < 19; ++t) {
      tr.old_logp[t] += jitter(rng);
      tr.behav_logp[t] = tr.old_logp[t] + jitter(rng);
      tr.ref_logp[t] += jitter(rng);
    }
    tr.advantage = k == 0 ? 1.1 : -0.9;
  }
  std::vector<const Trajectory*> batch = {&trs[0], &trs[1]};
  auto objective = [&] {
    Gradients unused;
    auto s = accumulate_policy_gradient(*model, batch, o, unused);
    EXPECT_TRUE(s.ok()) << s.status();
    return s->loss;
  };
  Gradients grads;
  auto stats = accumulate_policy_gradient(*model, batch, o, grads);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->tokens, 24);
  std::printf("[policy gradient] L %.6f, clip fraction %.3f, kl %.4f, tis %.3f\n", stats->loss,
              stats->clip_fraction, stats->kl, stats->tis_mean);
  for (const char* name : {"lm_head.weight", "layers.1.mlp.down_proj.weight"}) {
    const Tensor* g = grads.find(name);
    ASSERT_NE(g, nullptr) << name;
    Tensor* p = const_cast<Tensor*>(model->parameters().find(name));
    ASSERT_NE(p, nullptr) << name;
    double norm = 0;
    for (int64_t i = 0; i < g->numel(); ++i)
      norm += double{g->data<float>()[i]} * g->data<float>()[i];
    norm = std::sqrt(norm);
    const Tensor keep = p->clone();
    auto at = [&](double h) {
      for (int64_t i = 0; i < p->numel(); ++i)
        p->data<float>()[i] =
            keep.data<float>()[i] + static_cast<float>(h * g->data<float>()[i] / norm);
      return objective();
    };
    const double h = 3e-3;
    const double cd = (at(h) - at(-h)) / (2 * h);
    at(0);
    std::printf("[policy gradient] %s: |g| %.6g, central difference %.6g\n", name, norm, cd);
    // f32 objective rounding (~1e-7) / 2h ~ 2e-5 absolute, plus the h^2 truncation (measured
    // 1.4e-5 relative on down_proj).
    EXPECT_NEAR(cd, norm, 1e-3 * norm + 5e-5) << name;
  }
}

}  // namespace
}  // namespace loom::gradcheck
