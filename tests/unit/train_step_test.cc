// The trainer's optimizer step on the CPU: a small hybrid model (KDA and MLA mixers, dense FFNs,
// synthetic weights) trained on MQAR for a few dozen steps lowers its loss, clipping bounds the
// update, each load-balancing method does what it says, and a model loaded read-only is refused.
#include "trainer/train_step.h"

#include <cstdio>
#include <random>
#include <vector>

#include "engine/model/model.h"
#include "gtest/gtest.h"
#include "tests/unit/engine_test_support.h"
#include "weights/model_config.h"
#include "weights/weight_loader.h"

namespace loom {
namespace {

ModelConfig small_hybrid() {
  auto cfg = load_model_config(loom::testing::kFixtures + "/kimi_linear_s1");
  EXPECT_TRUE(cfg.ok()) << cfg.status();
  for (FfnType& f : cfg->ffns) f = FfnType::kDense;
  return *cfg;
}

TEST(TrainStep, LowersTheLossOnMqar) {
  const ModelConfig cfg = small_hybrid();
  auto model = Model::load(cfg, WeightLoader::synthetic(cfg, 3), Placement{.trainable = true});
  ASSERT_TRUE(model.ok()) << model.status();
  OptimizerOptions opt;
  opt.lr = {.peak_lr = 3e-3, .min_lr = 3e-4, .warmup_steps = 5, .total_steps = 60};
  auto step = TrainStep::create(**model, opt);
  ASSERT_TRUE(step.ok()) << step.status();
  MqarOptions task;
  task.num_pairs = 4;
  task.seq_len = 24;
  task.key_begin = 1;
  task.num_keys = 32;
  task.value_begin = 33;
  task.num_values = 32;
  ASSERT_TRUE(task.validate().ok());
  std::mt19937_64 rng(11);
  std::vector<double> losses;
  for (int s = 0; s < 60; ++s) {
    std::vector<Example> batch;
    for (int i = 0; i < 4; ++i) batch.push_back(make_mqar(task, rng));
    auto stats = step->run(batch);
    ASSERT_TRUE(stats.ok()) << stats.status();
    ASSERT_TRUE(std::isfinite(stats->loss) && std::isfinite(stats->grad_norm));
    EXPECT_EQ(stats->step, s + 1);
    losses.push_back(stats->loss);
  }
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) first += losses[i] / 5;
  for (int i = 50; i < 60; ++i) last += losses[i] / 10;
  std::printf("[train step] MQAR loss: first 5 steps %.3f, last 10 steps %.3f\n", first, last);
  // Uniform over 500 ids is ln 500 = 6.2 per scored token; knowing that answers are values
  // alone is ln 32 = 3.5.
  EXPECT_LT(last, 0.65 * first);
}

// MoE layers (sigmoid router with a selection bias): each step's expert counts come back with the
// gradients, and the quantile balancer moves each layer's bias exactly as its rule says for those
// counts; the bias gets no AdamW update.
TEST(TrainStep, BalancesEveryMoeLayersBias) {
  auto cfg = load_model_config(loom::testing::kFixtures + "/kimi_linear_s1");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  for (MixerType& m : cfg->mixers) m = MixerType::kKda;
  auto model = Model::load(*cfg, WeightLoader::synthetic(*cfg, 3), Placement{.trainable = true});
  ASSERT_TRUE(model.ok()) << model.status();
  OptimizerOptions opt;
  opt.lr = {.peak_lr = 1e-3, .min_lr = 1e-4, .warmup_steps = 1, .total_steps = 10};
  opt.balancer.eta = 0.05;
  auto step = TrainStep::create(**model, opt);
  ASSERT_TRUE(step.ok()) << step.status();
  MqarOptions task;
  task.num_pairs = 4;
  task.seq_len = 24;
  task.num_keys = 32;
  task.value_begin = 33;
  task.num_values = 32;
  std::mt19937_64 rng(4);
  int moe_layers = 0;
  for (FfnType f : cfg->ffns) moe_layers += f == FfnType::kMoe;
  for (int s = 0; s < 3; ++s) {
    std::vector<std::vector<float>> before;
    for (int l = 0; l < cfg->num_layers; ++l) {
      const Tensor* b =
          (*model)->parameters().find("layers." + std::to_string(l) + ".moe.router.bias");
      if (b != nullptr) before.emplace_back(b->data<float>(), b->data<float>() + b->numel());
    }
    std::vector<Example> batch = {make_mqar(task, rng), make_mqar(task, rng)};
    auto stats = step->run(batch);
    ASSERT_TRUE(stats.ok()) << stats.status();
    ASSERT_EQ(stats->routing.size(), static_cast<size_t>(moe_layers));
    for (size_t i = 0; i < stats->routing.size(); ++i) {
      const StepStats::Routing& r = stats->routing[i];
      int64_t total = 0;
      for (int64_t c : r.counts) total += c;
      EXPECT_EQ(total, 2 * 24 * cfg->moe.top_k) << r.bias;  // every token routes top_k times
      std::vector<float> want = before[i];
      quantile_balance_step(opt.balancer, r.counts, want);
      const Tensor* b = (*model)->parameters().find(r.bias);
      ASSERT_NE(b, nullptr);
      for (int64_t e = 0; e < b->numel(); ++e) EXPECT_EQ(b->data<float>()[e], want[e]) << r.bias;
    }
  }
}

// The other balancing methods leave the selection bias as it is and still report each layer's
// routing health from the step's counts. With the auxiliary loss, the step's aux_loss is the mean
// over the batch of the load-balancing loss Model::loss_and_gradients reports for each example
// (the same alpha), `loss` stays the cross-entropy, and the update differs from one without it.
TEST(TrainStep, AuxLossAndNoBalancingLeaveTheBias) {
  auto cfg = load_model_config(loom::testing::kFixtures + "/kimi_linear_s1");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  for (MixerType& m : cfg->mixers) m = MixerType::kKda;
  MqarOptions task;
  task.num_pairs = 4;
  task.seq_len = 24;
  task.num_keys = 32;
  task.value_begin = 33;
  task.num_values = 32;
  std::vector<float> router_after[2];
  for (BalanceMethod method : {BalanceMethod::kNone, BalanceMethod::kAuxLoss}) {
    auto model = Model::load(*cfg, WeightLoader::synthetic(*cfg, 3), Placement{.trainable = true});
    ASSERT_TRUE(model.ok()) << model.status();
    OptimizerOptions opt;
    opt.lr = {.peak_lr = 1e-3, .min_lr = 1e-4, .warmup_steps = 0, .total_steps = 10};
    opt.balance = method;
    opt.aux_loss_alpha = 0.05;
    auto step = TrainStep::create(**model, opt);
    ASSERT_TRUE(step.ok()) << step.status();
    const Tensor* bias = (*model)->parameters().find("layers.1.moe.router.bias");
    ASSERT_NE(bias, nullptr);
    const std::vector<float> bias_before(bias->data<float>(), bias->data<float>() + bias->numel());
    std::mt19937_64 rng(4);
    for (int s = 0; s < 2; ++s) {
      std::vector<Example> batch = {make_mqar(task, rng), make_mqar(task, rng)};
      Gradients oracle;
      oracle.set_aux_loss_alpha(method == BalanceMethod::kAuxLoss ? 0.05f : 0.0f);
      double ce = 0;
      for (const Example& ex : batch)
        ce += *(*model)->loss_and_gradients(ex.tokens, oracle, ex.loss_mask) / 2.0;
      auto stats = step->run(batch);
      ASSERT_TRUE(stats.ok()) << stats.status();
      // TrainStep runs the batch as one packed pass (max_tokens_per_pass), whose f32 sums run in
      // another order than these per-example calls' (tests/unit/packed_training_test.cc).
      EXPECT_NEAR(stats->loss, ce, 1e-5 * ce);
      EXPECT_NEAR(stats->aux_loss, oracle.aux_loss() / 2.0, 1e-5 * oracle.aux_loss() / 2.0);
      if (method == BalanceMethod::kAuxLoss) {
        // Four MoE layers, each about alpha (its value at an even load) or more.
        std::printf("[train step] aux loss at step %d: %.4f\n", s + 1, stats->aux_loss);
        EXPECT_GT(stats->aux_loss, 4 * 0.05 * 0.9);
      }
      ASSERT_EQ(stats->routing.size(), 4u);
      for (const StepStats::Routing& r : stats->routing) {
        const RoutingHealth want = routing_health(r.counts);
        EXPECT_EQ(r.health.max_violation, want.max_violation) << r.bias;
        EXPECT_EQ(r.health.load_entropy, want.load_entropy) << r.bias;
        EXPECT_EQ(r.health.bias_update_l1, 0.0) << r.bias;
      }
      EXPECT_EQ(std::vector<float>(bias->data<float>(), bias->data<float>() + bias->numel()),
                bias_before);
    }
    const Tensor* router = (*model)->parameters().find("layers.1.moe.router.weight");
    router_after[method == BalanceMethod::kAuxLoss].assign(router->data<float>(),
                                                           router->data<float>() + router->numel());
  }
  EXPECT_NE(router_after[0], router_after[1]);
  OptimizerOptions bad;
  bad.balance = BalanceMethod::kAuxLoss;
  bad.aux_loss_alpha = 0;
  EXPECT_NE(bad.validate().message().find("aux_loss_alpha"), std::string::npos);
}

TEST(TrainStep, RefusesAReadOnlyModel) {
  const ModelConfig cfg = small_hybrid();
  auto model = Model::load(cfg, WeightLoader::synthetic(cfg, 3));
  ASSERT_TRUE(model.ok()) << model.status();
  auto step = TrainStep::create(**model, OptimizerOptions{});
  EXPECT_EQ(step.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Model::load(cfg, WeightLoader::synthetic(cfg, 3),
                        Placement{.dtype = WeightDType::kBF16, .trainable = true})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loom
