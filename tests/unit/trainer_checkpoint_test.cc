// Training checkpoints: a run saved after 3 steps and resumed from the folder continues with the
// same losses, bit for bit, as the run that never stopped (weights, both AdamW moments, the step
// count and the data RNG all come back); the folder loads for serving as it is.
#include <unistd.h>

#include <filesystem>
#include <random>
#include <sstream>
#include <vector>

#include "engine/model/model.h"
#include "gtest/gtest.h"
#include "tests/unit/engine_test_support.h"
#include "trainer/checkpoint.h"
#include "trainer/train_step.h"
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

MqarOptions task() {
  MqarOptions t;
  t.num_pairs = 3;
  t.seq_len = 16;
  t.num_keys = 32;
  t.value_begin = 33;
  t.num_values = 32;
  return t;
}

OptimizerOptions optimizer() {
  OptimizerOptions o;
  o.lr = {.peak_lr = 3e-3, .min_lr = 3e-4, .warmup_steps = 2, .total_steps = 6};
  return o;
}

std::vector<double> train(TrainStep& step, std::mt19937_64& rng, int steps) {
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    std::vector<Example> batch = {make_mqar(task(), rng), make_mqar(task(), rng)};
    auto stats = step.run(batch);
    EXPECT_TRUE(stats.ok()) << stats.status();
    losses.push_back(stats.ok() ? stats->loss : 0.0);
  }
  return losses;
}

TEST(TrainerCheckpoint, AResumedRunContinuesBitForBit) {
  const ModelConfig cfg = small_hybrid();
  // The run that never stops.
  auto a = Model::load(cfg, WeightLoader::synthetic(cfg, 9), Placement{.trainable = true});
  ASSERT_TRUE(a.ok()) << a.status();
  auto step_a = TrainStep::create(**a, optimizer());
  ASSERT_TRUE(step_a.ok());
  std::mt19937_64 rng_a(5);
  const std::vector<double> whole = train(*step_a, rng_a, 6);

  // The run saved after 3 steps, then resumed from the folder alone.
  const std::string dir =
      std::string(LOOM_TEST_TMPDIR) + "/trainer_ckpt." + std::to_string(::getpid());
  {
    auto b = Model::load(cfg, WeightLoader::synthetic(cfg, 9), Placement{.trainable = true});
    ASSERT_TRUE(b.ok());
    auto step_b = TrainStep::create(**b, optimizer());
    ASSERT_TRUE(step_b.ok());
    std::mt19937_64 rng_b(5);
    const std::vector<double> first = train(*step_b, rng_b, 3);
    for (int i = 0; i < 3; ++i) ASSERT_EQ(first[i], whole[i]);
    std::ostringstream rng_state;
    rng_state << rng_b;
    ASSERT_TRUE(save_checkpoint(dir, **b, *step_b, {{"data_rng", rng_state.str()}}).ok());
  }
  EXPECT_FALSE(std::filesystem::exists(dir + ".tmp"));
  EXPECT_FALSE(std::filesystem::exists(dir + ".old"));
  auto c = Model::load(dir, Placement{.trainable = true});
  ASSERT_TRUE(c.ok()) << c.status();
  // The folder serves as it is: a read-only load gives the same logits as the resumed model.
  auto served = Model::load(dir);
  ASSERT_TRUE(served.ok()) << served.status();
  const std::vector<int32_t> prompt = {1, 40, 2, 41, 1};
  auto logits_of = [&](const Model& m) {
    SequenceCache cache = m.new_cache();
    ForwardBatch batch;
    batch.token_ids = prompt;
    batch.seqs.push_back({.num_tokens = 5, .logits = LogitsMode::kLast, .cache = &cache});
    auto out = m.forward(batch);
    EXPECT_TRUE(out.ok());
    return out.ok() ? out->clone() : Tensor();
  };
  const Tensor x = logits_of(**served), y = logits_of(**c);  // c: before its further steps
  for (int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(x.data<float>()[i], y.data<float>()[i]) << i;
  auto step_c = TrainStep::create(**c, optimizer());
  ASSERT_TRUE(step_c.ok());
  auto meta = load_trainer_state(dir, *step_c);
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(step_c->steps(), 3);
  std::mt19937_64 rng_c;
  std::istringstream((*meta)["data_rng"]) >> rng_c;
  const std::vector<double> rest = train(*step_c, rng_c, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(rest[i], whole[3 + i]) << "step " << 4 + i;

  std::filesystem::remove_all(dir);
}

TEST(TrainerCheckpoint, RejectsAStateForAnotherModel) {
  const ModelConfig cfg = small_hybrid();
  auto model = Model::load(cfg, WeightLoader::synthetic(cfg, 9), Placement{.trainable = true});
  ASSERT_TRUE(model.ok());
  auto step = TrainStep::create(**model, optimizer());
  ASSERT_TRUE(step.ok());
  std::vector<std::pair<std::string, Tensor>> state = step->state();
  state.pop_back();  // one moment missing
  EXPECT_EQ(step->restore(state).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      load_trainer_state(std::string(LOOM_TEST_TMPDIR) + "/no-such-ckpt", *step).status().code(),
      absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace loom
