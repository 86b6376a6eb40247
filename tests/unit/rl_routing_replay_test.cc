// Routing replay in the RL loop (trainer/rl/routing_replay.h): the rollout's record of the
// engine's experts (hand-made records: runs written at their positions, positions one episode
// never computed filled from another with the same tokens up to there, the replay's per-layer
// layout), rollouts through the engine on the bundled MoE config whose records equal the training
// forward's own routing at every position they cover (group-mates sharing a prompt: the prefix
// cache's positions come from the episode that computed them), the policy loss replaying them
// (its forward and the old logprobs' route alike: every importance ratio is exactly 1), and the
// RL.json switch.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/model/model.h"
#include "engine/tokenizer/tokenizer.h"
#include "tests/unit/trainer_routing_test_support.h"
#include "trainer/rl/arithmetic_env.h"
#include "trainer/rl/policy_loss.h"
#include "trainer/rl/rollout.h"
#include "trainer/rl/routing_replay.h"
#include "trainer/run_config.h"

namespace loom {
namespace {

Trajectory with_tokens(std::vector<int32_t> tokens) {
  Trajectory tr;
  tr.tokens = std::move(tokens);
  tr.routed_layers = 1;
  tr.routed_top_k = 2;
  return tr;
}

TEST(RlRoutingRecord, RunsLandAtTheirPositionsAndSharedPrefixesFill) {
  std::vector<Trajectory> trs;
  trs.push_back(with_tokens({1, 2, 3, 4, 5}));
  trs.push_back(with_tokens({1, 2, 3, 9, 9, 9}));
  trs.push_back(with_tokens({7, 2, 3}));
  // A computed positions 0-3; B only 3-4 (0-2 came from the prefix cache); C nothing.
  const RoutedExperts a{.first_position = 0, .rows = 4, .expert_ids = {0, 1, 2, 3, 4, 5, 6, 7}};
  ASSERT_TRUE(add_routed_experts(std::span(&a, 1), trs[0]).ok());
  const RoutedExperts b{.first_position = 3, .rows = 2, .expert_ids = {10, 11, 12, 13}};
  ASSERT_TRUE(add_routed_experts(std::span(&b, 1), trs[1]).ok());
  EXPECT_EQ(trs[1].routed_experts, (std::vector<int32_t>{-1, -1, -1, -1, -1, -1, 10, 11, 12, 13}));
  EXPECT_EQ(fill_shared_prefix_routing(trs), 3);
  EXPECT_EQ(trs[0].routed_experts, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, -1, -1}));
  EXPECT_EQ(trs[1].routed_experts,
            (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 10, 11, 12, 13, -1, -1}));
  // C's positions 1-2 hold A's tokens but after another first token: nothing to copy.
  EXPECT_EQ(trs[2].routed_experts, std::vector<int32_t>(6, -1));
  EXPECT_DOUBLE_EQ(routing_coverage(trs[0]), 1.0);
  EXPECT_DOUBLE_EQ(routing_coverage(trs[1]), 1.0);
  EXPECT_DOUBLE_EQ(routing_coverage(trs[2]), 0.0);

  const RoutedExperts bad{.first_position = 0, .rows = 2, .expert_ids = {1, 2, 3}};
  EXPECT_EQ(add_routed_experts(std::span(&bad, 1), trs[2]).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RlRoutingRecord, ReplayLayoutFollowsTheModelsMoeLayers) {
  ModelConfig cfg;
  cfg.num_layers = 3;
  cfg.ffns = {FfnType::kMoe, FfnType::kDense, FfnType::kMoe};
  cfg.moe.top_k = 2;
  Trajectory tr = with_tokens({5, 6});
  tr.routed_layers = 2;
  // [positions 2, layers 2, top-k 2]
  tr.routed_experts = {0, 1, 2, 3, 4, 5, -1, -1};
  auto replay = routing_replay_of(tr, cfg, true);
  ASSERT_TRUE(replay.ok()) << replay.status();
  ASSERT_EQ(replay->expert_ids.size(), 3u);
  EXPECT_FALSE(replay->expert_ids[1].defined());
  const Tensor& l0 = replay->expert_ids[0];
  const Tensor& l2 = replay->expert_ids[2];
  EXPECT_EQ(std::vector<int32_t>(l0.data<int32_t>(), l0.data<int32_t>() + 4),
            (std::vector<int32_t>{0, 1, 4, 5}));
  EXPECT_EQ(std::vector<int32_t>(l2.data<int32_t>(), l2.data<int32_t>() + 4),
            (std::vector<int32_t>{2, 3, -1, -1}));
  tr.routed_layers = 1;
  EXPECT_EQ(routing_replay_of(tr, cfg, true).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RlRoutingRecord, RolloutRecordsTheEnginesRoutingAndThePolicyLossReplaysIt) {
  const std::string config = std::string(LOOM_SOURCE_DIR) + "/weights/default/config.json";
  std::shared_ptr<const Tokenizer> tok = Tokenizer::byte_level();
  auto chat = chat_setup_for(ChatFormat::kNative, *tok);
  ASSERT_TRUE(chat.ok()) << chat.status();
  auto trainer = Model::load_random(config, 3, Placement{.trainable = true});
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  auto model = Model::load_random(config, 3);
  ASSERT_TRUE(model.ok()) << model.status();
  EngineOptions options;
  options.deterministic = true;
  // One sequence at a time and a linear-state checkpoint at every block: each episode's first
  // prompt is then served from the cache of the one before, which the rollout has to fill from.
  options.max_num_seqs = 1;
  options.checkpoint_interval = 1;
  auto engine = Engine::create(std::move(model).value(), tok, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<std::unique_ptr<ArithmeticEnv>> envs;
  std::vector<EpisodeSpec> specs;
  for (int i = 0; i < 3; ++i) {
    envs.push_back(std::make_unique<ArithmeticEnv>(ArithmeticEnvOptions{}));
    specs.push_back({.env = envs.back().get(), .env_seed = 7, .sample_seed = 200u + i});
  }
  RolloutOptions ro{.max_turns = 2, .max_turn_tokens = 16, .max_trajectory_tokens = 1024};
  ro.record_routing = true;
  const int64_t hits_before = (*engine)->stats().prefix_hit_tokens;
  auto trs = run_rollouts(**engine, *tok, *chat, specs, ro);
  ASSERT_TRUE(trs.ok()) << trs.status();
  // Episodes 2 and 3 start from episode 1's cached prompt: their record of it is episode 1's.
  EXPECT_GT((*engine)->stats().prefix_hit_tokens - hits_before, 0);
  const ModelConfig& cfg = (*trainer)->config();
  int64_t covered = 0, positions = 0;
  for (const Trajectory& tr : *trs) {
    const int64_t row = static_cast<int64_t>(tr.routed_layers) * tr.routed_top_k;
    ASSERT_EQ(tr.routed_experts.size(), tr.tokens.size() * static_cast<size_t>(row));
    const std::vector<int32_t> want = trainer_routing(**trainer, tr.tokens);
    for (size_t p = 0; p + 1 < tr.tokens.size(); ++p) {
      ++positions;
      if (tr.routed_experts[p * row] < 0) continue;
      ++covered;
      for (int64_t j = 0; j < row; ++j)
        ASSERT_EQ(tr.routed_experts[p * row + j], want[p * row + j]) << "position " << p;
    }
    // The last token is never fed back.
    EXPECT_EQ(tr.routed_experts[(tr.tokens.size() - 1) * row], -1);
    // Every position before it was computed by some request of this call, unless the episode
    // ended on a budget with context the engine never saw.
    if (!tr.truncated) {
      EXPECT_DOUBLE_EQ(routing_coverage(tr), 1.0);
    }
  }
  std::printf("[rl routing replay] %lld of %lld positions recorded (%lld prompt tokens hit)\n",
              static_cast<long long>(covered), static_cast<long long>(positions),
              static_cast<long long>((*engine)->stats().prefix_hit_tokens - hits_before));
  // No episode here ends on the trajectory budget: every position but the last is recorded.
  EXPECT_EQ(covered, positions);

  // The policy loss with replay: old logprobs replayed too, so every ratio is exactly 1.
  std::vector<Trajectory> scored = *trs;
  std::vector<const Trajectory*> batch;
  int64_t replayed = 0;
  for (size_t i = 0; i < scored.size(); ++i) {
    Trajectory& tr = scored[i];
    auto replay = routing_replay_of(tr, cfg, true);
    ASSERT_TRUE(replay.ok()) << replay.status();
    auto logp = token_logprobs(**trainer, tr.tokens, &*replay);
    ASSERT_TRUE(logp.ok()) << logp.status();
    tr.old_logp = *logp;
    tr.advantage = i % 2 == 0 ? 1.0 : -1.0;
    replayed += replay->replayed_slots;
    batch.push_back(&tr);
  }
  EXPECT_GT(replayed, 0);
  Gradients grads;
  auto stats = accumulate_policy_gradient(**trainer, batch, GrpoOptions{}, grads, true);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_GT(stats->tokens, 0);
  EXPECT_DOUBLE_EQ(stats->ratio_mean, 1.0);
  EXPECT_EQ(stats->clip_fraction, 0.0);
  EXPECT_NE(grads.find("layers.1.moe.router.weight"), nullptr);
  EXPECT_EQ(grads.find("layers.1.moe.router.bias"), nullptr);

  // A trajectory without a record cannot be replayed.
  Trajectory bare = scored[0];
  bare.routed_experts.clear();
  const Trajectory* one[] = {&bare};
  Gradients unused;
  EXPECT_EQ(accumulate_policy_gradient(**trainer, one, GrpoOptions{}, unused, true).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RlRoutingRecord, ConfigSwitch) {
  const std::string base = R"({"model": {"config": "c.json"}, "out": "/tmp/x")";
  auto off = parse_rl_config(base + "}");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->routing_replay, RoutingReplayMode::kOff);
  auto on = parse_rl_config(base + R"(, "routing_replay": "on"})");
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_EQ(on->routing_replay, RoutingReplayMode::kOn);
  auto measure = parse_rl_config(base + R"(, "routing_replay": "measure"})");
  ASSERT_TRUE(measure.ok()) << measure.status();
  EXPECT_EQ(measure->routing_replay, RoutingReplayMode::kMeasure);
  auto bad = parse_rl_config(base + R"(, "routing_replay": "yes"})");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("routing_replay"), std::string::npos) << bad.status();
  auto typed = parse_rl_config(base + R"(, "routing_replay": true})");
  EXPECT_EQ(typed.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loom
