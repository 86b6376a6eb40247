// The engine's routing record (Request::return_routed_experts, routing replay for MoE RL, issue
// 20) on the bundled config (KDA + MLA, five MoE layers of top-2 of 8, random weights) in
// deterministic mode: the runs a request gets cover every position its forwards computed (prompt
// chunks, then each sampled token fed back) exactly once, and are the experts the training
// forward's own routing picks over the same tokens (the batch-invariant numerics give the same
// bits however the sequence is split into steps); a second request served from the prefix cache
// gets only the positions after its hit; a request that does not ask gets nothing; a dense model
// refuses the option.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/model/model.h"
#include "tests/unit/engine_test_support.h"
#include "tests/unit/trainer_routing_test_support.h"

namespace loom {
namespace {

const std::string kConfig = std::string(LOOM_SOURCE_DIR) + "/weights/default/config.json";

struct Generated {
  std::vector<int32_t> tokens;
  std::vector<RoutedExperts> runs;
  int64_t hit = 0;  // prompt tokens served from the prefix cache
};

Generated generate(Engine& e, const std::vector<int32_t>& prompt, bool record) {
  const int64_t hits_before = e.stats().prefix_hit_tokens;
  Request r;
  r.prompt = prompt;
  r.params.temperature = 1.0f;
  r.params.seed = 9;
  r.params.max_tokens = 10;
  r.params.ignore_eos = true;
  r.return_routed_experts = record;
  auto stream = e.submit(std::move(r));
  EXPECT_TRUE(stream.ok()) << stream.status();
  Generated g;
  while (std::optional<RequestOutput> ev = (*stream)->next()) {
    g.tokens.insert(g.tokens.end(), ev->token_ids.begin(), ev->token_ids.end());
    for (RoutedExperts& run : ev->routed_experts) g.runs.push_back(std::move(run));
  }
  e.wait_idle();
  g.hit = e.stats().prefix_hit_tokens - hits_before;
  return g;
}

TEST(EngineRoutedExperts, RecordsEveryComputedPositionAsTheTrainerRoutesIt) {
  auto model = Model::load_random(kConfig, 3);
  ASSERT_TRUE(model.ok()) << model.status();
  auto trainer = Model::load_random(kConfig, 3);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  const ModelConfig& cfg = (*model)->config();
  int moe_layers = 0;
  for (FfnType f : cfg.ffns) moe_layers += f == FfnType::kMoe;
  const int64_t row = static_cast<int64_t>(moe_layers) * cfg.moe.top_k;
  EngineOptions o;
  o.deterministic = true;
  o.max_num_batched_tokens = 96;  // the prompt goes in chunks over several steps
  auto engine = Engine::create(std::move(model).value(), nullptr, o);
  ASSERT_TRUE(engine.ok()) << engine.status();

  std::mt19937 rng(4);
  std::uniform_int_distribution<int> tok(0, 255);
  std::vector<int32_t> prompt(601);
  for (int32_t& t : prompt) t = tok(rng);
  const Generated a = generate(**engine, prompt, true);
  ASSERT_EQ(a.tokens.size(), 10u);
  // Positions 0 .. prompt + 10 - 2: the last sampled token is never fed back.
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), a.tokens.begin(), a.tokens.end() - 1);
  ASSERT_EQ(a.hit, 0);
  int64_t next = 0;
  std::vector<int32_t> recorded;
  for (const RoutedExperts& run : a.runs) {
    EXPECT_EQ(run.first_position, next);
    ASSERT_EQ(static_cast<int64_t>(run.expert_ids.size()), run.rows * row);
    next += run.rows;
    recorded.insert(recorded.end(), run.expert_ids.begin(), run.expert_ids.end());
  }
  EXPECT_EQ(next, static_cast<int64_t>(seq.size()));
  const std::vector<int32_t> want = trainer_routing(**trainer, seq);
  ASSERT_EQ(recorded.size(), want.size());
  int64_t differ = 0;
  for (size_t i = 0; i < want.size(); ++i) differ += recorded[i] != want[i];
  std::printf("[routed experts] %zu positions in %zu runs, %lld of %zu ids differ\n", seq.size(),
              a.runs.size(), static_cast<long long>(differ), want.size());
  EXPECT_EQ(differ, 0);

  // The same prompt again: the prefix cache serves a block-aligned prefix, which this request
  // did not compute; its record starts where its forwards did.
  const Generated b = generate(**engine, prompt, true);
  ASSERT_GT(b.hit, 0);
  ASSERT_FALSE(b.runs.empty());
  EXPECT_EQ(b.runs.front().first_position, b.hit);
  for (int64_t p = b.hit; p < static_cast<int64_t>(prompt.size()); ++p)
    for (int64_t j = 0; j < row; ++j)
      ASSERT_EQ(b.runs.front().expert_ids[(p - b.hit) * row + j], want[p * row + j]) << p;

  // Not asked: nothing recorded.
  const Generated c = generate(**engine, prompt, false);
  EXPECT_TRUE(c.runs.empty());
}

TEST(EngineRoutedExperts, DenseModelRefusesTheOption) {
  auto model =
      Model::load_random(std::string(LOOM_SOURCE_DIR) + "/tests/long/rl_tiny_config.json", 1);
  ASSERT_TRUE(model.ok()) << model.status();
  auto engine = Engine::create(std::move(model).value(), nullptr, EngineOptions{});
  ASSERT_TRUE(engine.ok()) << engine.status();
  Request r;
  r.prompt = {1, 2, 3};
  r.return_routed_experts = true;
  auto stream = (*engine)->submit(std::move(r));
  EXPECT_EQ(stream.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(stream.status().message().find("no MoE layers"), std::string::npos) << stream.status();
}

}  // namespace
}  // namespace loom
