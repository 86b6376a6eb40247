// Rollouts through the serving engine (trainer/rl/rollout.h) on the bundled model's config with
// random weights (untrained: the episodes' rewards are whatever they are) with the byte-level
// tokenizer: every episode comes back with a consistent token / mask / logprob layout, each sampled
// token's behaviour logprob (the engine's) equals the trainer's logprob of the same token
// (token_logprobs: the training forward over the whole conversation) to f32 precision, and the same
// seeds give the same trajectories.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "engine/model/model.h"
#include "engine/tokenizer/tokenizer.h"
#include "tests/unit/engine_test_support.h"
#include "trainer/rl/arithmetic_env.h"
#include "trainer/rl/policy_loss.h"
#include "trainer/rl/rollout.h"

namespace loom {
namespace {

// The engine runs in deterministic (batch-invariant) mode: in default numerics a token's logprob
// depends on how the group's episodes happen to be batched with each other, which varies run to
// run, so "the same seeds give the same trajectories" would not hold.
TEST(RlRollout, EngineLogprobsMatchTheTrainerAndRepeat) {
  // The bundled model's config (vocabulary 260: the byte-level tokenizer's), random weights.
  const std::string config = std::string(LOOM_SOURCE_DIR) + "/weights/default/config.json";
  std::shared_ptr<const Tokenizer> tok = Tokenizer::byte_level();
  auto chat = chat_setup_for(ChatFormat::kNative, *tok);
  ASSERT_TRUE(chat.ok()) << chat.status();
  auto trainer_model = Model::load_random(config, 3);
  ASSERT_TRUE(trainer_model.ok()) << trainer_model.status();
  auto run = [&] {
    auto model = Model::load_random(config, 3);
    EXPECT_TRUE(model.ok()) << model.status();
    EngineOptions options;
    options.deterministic = true;
    auto engine = Engine::create(std::move(model).value(), tok, options);
    EXPECT_TRUE(engine.ok()) << engine.status();
    std::vector<std::unique_ptr<ArithmeticEnv>> envs;
    std::vector<EpisodeSpec> specs;
    for (int i = 0; i < 4; ++i) {
      envs.push_back(std::make_unique<ArithmeticEnv>(ArithmeticEnvOptions{}));
      specs.push_back({.env = envs.back().get(), .env_seed = 7, .sample_seed = 100u + i});
    }
    auto out = run_rollouts(**engine, *tok, *chat, specs,
                            {.max_turns = 2, .max_turn_tokens = 24, .max_trajectory_tokens = 1024});
    EXPECT_TRUE(out.ok()) << out.status();
    return std::move(out).value();
  };
  const std::vector<Trajectory> a = run();
  ASSERT_EQ(a.size(), 4u);
  double worst = 0;
  int64_t sampled_total = 0;
  for (const Trajectory& tr : a) {
    const size_t n = tr.tokens.size();
    ASSERT_EQ(tr.sampled.size(), n);
    ASSERT_EQ(tr.behav_logp.size(), n);
    EXPECT_EQ(tr.sampled.back(), 0);
    int64_t sampled = 0;
    for (uint8_t s : tr.sampled) sampled += s;
    EXPECT_EQ(sampled, tr.response_tokens);
    EXPECT_GE(tr.turns, 1);
    EXPECT_TRUE(tr.answered || tr.truncated);
    sampled_total += sampled;
    auto logp = token_logprobs(**trainer_model, tr.tokens);
    ASSERT_TRUE(logp.ok()) << logp.status();
    for (size_t i = 0; i + 1 < n; ++i) {
      if (!tr.sampled[i]) continue;
      EXPECT_LE(tr.behav_logp[i], 0.0f);
      worst = std::max(worst, std::abs(double{tr.behav_logp[i]} - (*logp)[i]));
    }
  }
  std::printf("[rl rollout] %lld sampled tokens, worst |engine - trainer| logprob %.3g\n",
              static_cast<long long>(sampled_total), worst);
  EXPECT_GT(sampled_total, 0);
  // f32 forwards of different shapes (decode steps vs one prefill over the conversation):
  // measured 4.3e-6 on 96 tokens.
  EXPECT_LT(worst, 1e-4);
  // Different sample seeds, different samples.
  EXPECT_NE(a[0].tokens, a[1].tokens);
  const std::vector<Trajectory> b = run();
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens) << i;
    EXPECT_EQ(a[i].behav_logp, b[i].behav_logp) << i;
  }
}

}  // namespace
}  // namespace loom
