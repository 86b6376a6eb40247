// Staged context extension and per-position losses (docs/trainer.md): the run config's stages,
// balance (each method and its options) and routing_warnings fields (each mistake names its field);
// the stage stability rule on synthetic loss sequences; position buckets; Model::set_rope_theta
// changes a rotary model's logits and setting the original theta back restores them bit for bit;
// the per-position losses of loss_and_gradients average to its loss; a two-stage run (16 then 32
// tokens, a new RoPE base) switches stage in its metrics, logs loss_by_position, and resumes from a
// checkpoint in stage 2 with the uninterrupted run's losses exactly.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "engine/model/model.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/engine_test_support.h"
#include "trainer/run_config.h"
#include "trainer/stages.h"
#include "trainer/train_run.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string tmp(const std::string& name) {
  return std::string(LOOM_TEST_TMPDIR) + "/train_stages." + std::to_string(::getpid()) + "." + name;
}

// qwen3_next_s0: GDN layers and a GQA layer with partial RoPE (theta 10000).
json staged_run(const std::string& out) {
  return {
      {"model", {{"config", loom::testing::kFixtures + "/qwen3_next_s0/config.json"}, {"seed", 3}}},
      {"data",
       {{"task", "mqar"},
        {"seq_len", 16},
        {"mqar", {{"num_pairs", 3}, {"num_keys", 32}, {"value_begin", 33}, {"num_values", 32}}}}},
      {"stages",
       {{{"seq_len", 16}, {"min_steps", 2}, {"max_steps", 3}},
        {{"seq_len", 32},
         {"rope_theta", 500000.0},
         {"max_steps", 4},
         {"mqar", {{"num_pairs", 6}}}}}},
      {"stage_stability", {{"window", 2}, {"tolerance", 1e-12}}},
      {"loss_bucket", 8},
      {"batch_size", 2},
      {"checkpoint_every", 5},
      {"optimizer", {{"peak_lr", 3e-3}, {"min_lr", 3e-4}, {"warmup_steps", 2}}},
      {"out", out},
      {"seed", 7}};
}

std::vector<json> lines_in(const std::string& run) {
  std::vector<json> out;
  std::ifstream f(fs::path(run) / "metrics.jsonl");
  std::string line;
  while (std::getline(f, line)) out.push_back(json::parse(line));
  return out;
}

std::string message_of(const json& j) {
  return std::string(parse_run_config(j.dump()).status().message());
}

TEST(StagedRunConfig, ParsesStagesBalanceAndWarnings) {
  json j = staged_run("/tmp/x");
  j["balance"] = {{"method", "quantile"}, {"eta", 0.01}, {"q_low", 0.1}, {"q_high", 0.9}};
  j["routing_warnings"] = {
      {"min_entropy", 0.5}, {"max_violation", 2.0}, {"max_idle_fraction", 0.2}};
  auto c = parse_run_config(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->optimizer.balance, BalanceMethod::kQuantile);
  EXPECT_EQ(c->optimizer.balancer.eta, 0.01);
  EXPECT_EQ(c->optimizer.balancer.q_low, 0.1);
  EXPECT_EQ(c->optimizer.balancer.q_high, 0.9);
  EXPECT_EQ(c->optimizer.balancer.warn_min_entropy, 0.5);
  EXPECT_EQ(c->optimizer.balancer.warn_max_violation, 2.0);
  EXPECT_EQ(c->optimizer.balancer.warn_max_idle_fraction, 0.2);
  ASSERT_EQ(c->stages.size(), 2u);
  EXPECT_EQ(c->stages[0].seq_len, 16);
  EXPECT_EQ(c->stages[0].rope_theta, 0);  // unchanged
  EXPECT_EQ(c->stages[1].rope_theta, 500000.0);
  EXPECT_EQ(c->stages[1].mqar.num_pairs, 6);  // the stage's override
  EXPECT_EQ(c->stages[1].mqar.num_keys, 32);  // the rest from data.mqar
  EXPECT_EQ(c->stages[1].mqar.seq_len, 32);   // the stage's length
  EXPECT_EQ(c->steps, 7);                     // the stages' max_steps
  EXPECT_EQ(c->optimizer.lr.total_steps, 7);
  EXPECT_EQ(c->stage_stability.window, 2);
  EXPECT_EQ(c->loss_bucket, 8);
  // Without the new fields: the defaults of today.
  json plain = staged_run("/tmp/x");
  plain.erase("stages");
  plain.erase("stage_stability");
  plain.erase("loss_bucket");
  auto p = parse_run_config(plain.dump());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->stages.empty());
  EXPECT_EQ(p->optimizer.balance, BalanceMethod::kQuantile);
  EXPECT_EQ(p->optimizer.balancer.eta, QuantileBalancerOptions{}.eta);
  EXPECT_EQ(p->loss_bucket, 256);
  EXPECT_EQ(p->steps, 100);
  // The other methods, and the spelling before balance.method.
  const std::pair<json, BalanceMethod> methods[] = {
      {{{"method", "none"}}, BalanceMethod::kNone},
      {{{"method", "aux_loss"}}, BalanceMethod::kAuxLoss},
      {{{"enabled", false}}, BalanceMethod::kNone},
      {{{"enabled", true}}, BalanceMethod::kQuantile}};
  for (const auto& [balance, want] : methods) {
    json m = plain;
    m["balance"] = balance;
    auto parsed = parse_run_config(m.dump());
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->optimizer.balance, want) << balance.dump();
    EXPECT_EQ(parsed->optimizer.aux_loss_alpha, OptimizerOptions{}.aux_loss_alpha);
  }
  json aux = plain;
  aux["balance"] = {{"method", "aux_loss"}, {"aux_alpha", 0.003}};
  auto a = parse_run_config(aux.dump());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->optimizer.aux_loss_alpha, 0.003);
}

TEST(StagedRunConfig, NamesTheFieldOfEveryMistake) {
  const json good = staged_run("/tmp/x");
  ASSERT_TRUE(parse_run_config(good.dump()).ok());
  struct Case {
    std::function<void(json&)> edit;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](json& j) {
         j["balance"] = {{"etaa", 1}};
       },
       "balance.etaa"},
      {[](json& j) {
         j["balance"] = {{"enabled", 1}};
       },
       "balance.enabled"},
      {[](json& j) {
         j["balance"] = {{"eta", "big"}};
       },
       "balance.eta"},
      {[](json& j) {
         j["balance"] = {{"eta", -1}};
       },
       "balance.eta"},
      {[](json& j) {
         j["balance"] = {{"q_low", 1.5}};
       },
       "balance.q_low"},
      {[](json& j) {
         j["balance"] = {{"q_low", 0.8}, {"q_high", 0.2}};
       },
       "balance.q_low"},
      {[](json& j) { j["balance"] = 3; }, "balance"},
      {[](json& j) {
         j["balance"] = {{"method", "switch"}};
       },
       "balance.method"},
      {[](json& j) {
         j["balance"] = {{"method", 1}};
       },
       "balance.method"},
      {[](json& j) {
         j["balance"] = {{"method", "none"}, {"enabled", false}};
       },
       "balance.enabled"},
      {[](json& j) {
         j["balance"] = {{"method", "aux_loss"}, {"eta", 0.1}};
       },
       "balance.eta"},
      {[](json& j) {
         j["balance"] = {{"method", "none"}, {"q_low", 0.1}};
       },
       "balance.q_low"},
      {[](json& j) {
         j["balance"] = {{"aux_alpha", 0.1}};
       },
       "balance.aux_alpha"},
      {[](json& j) {
         j["balance"] = {{"method", "aux_loss"}, {"aux_alpha", 0}};
       },
       "balance.aux_alpha"},
      {[](json& j) {
         j["balance"] = {{"method", "aux_loss"}, {"aux_alpha", -1}};
       },
       "balance.aux_alpha"},
      {[](json& j) {
         j["routing_warnings"] = {{"min_entropy", 2}};
       },
       "routing_warnings.min_entropy"},
      {[](json& j) {
         j["routing_warnings"] = {{"max_violation", -1}};
       },
       "routing_warnings.max_violation"},
      {[](json& j) {
         j["routing_warnings"] = {{"max_idle_fraction", true}};
       },
       "routing_warnings.max_idle_fraction"},
      {[](json& j) {
         j["routing_warnings"] = {{"idle", 0.1}};
       },
       "routing_warnings.idle"},
      {[](json& j) { j["stages"] = json::array(); }, "run.stages"},
      {[](json& j) { j["stages"] = 1; }, "run.stages"},
      {[](json& j) { j["stages"][1]["bogus"] = 1; }, "stages[1].bogus"},
      {[](json& j) { j["stages"][0].erase("seq_len"); }, "stages[0].seq_len"},
      {[](json& j) { j["stages"][0]["seq_len"] = 1; }, "stages[0].seq_len"},
      {[](json& j) { j["stages"][0]["seq_len"] = "16"; }, "stages[0].seq_len"},
      {[](json& j) { j["stages"][1].erase("max_steps"); }, "stages[1].max_steps"},
      {[](json& j) { j["stages"][1]["max_steps"] = 0; }, "stages[1].max_steps"},
      {[](json& j) { j["stages"][0]["min_steps"] = 9; }, "stages[0].min_steps"},
      {[](json& j) { j["stages"][1]["rope_theta"] = 0; }, "stages[1].rope_theta"},
      {[](json& j) { j["stages"][1]["rope_theta"] = "big"; }, "stages[1].rope_theta"},
      {[](json& j) { j["stages"][0]["target_loss"] = 0; }, "stages[0].target_loss"},
      {[](json& j) { j["stages"][0]["target_loss"] = "low"; }, "stages[0].target_loss"},
      {[](json& j) {
         j["stages"][1]["mqar"] = {{"num_pairs", 40}};
       },
       "stages[1].mqar"},
      {[](json& j) {
         j["stages"][1]["mqar"] = {{"pairs", 4}};
       },
       "stages[1].mqar.pairs"},
      {[](json& j) {
         j["stage_stability"] = {{"window", 0}};
       },
       "stage_stability.window"},
      {[](json& j) {
         j["stage_stability"] = {{"tolerance", -1}};
       },
       "stage_stability.tolerance"},
      {[](json& j) {
         j["stage_stability"] = {{"w", 3}};
       },
       "stage_stability.w"},
      {[](json& j) { j["loss_bucket"] = 0; }, "run.loss_bucket"},
  };
  for (const Case& c : cases) {
    json j = good;
    c.edit(j);
    const std::string m = message_of(j);
    EXPECT_NE(m.find(c.field), std::string::npos) << c.field << ": " << m;
  }
  json shards = good;
  shards["data"] = {{"task", "shards"}, {"shards", {"/x"}}, {"seq_len", 16}};
  EXPECT_NE(message_of(shards).find("stages[1].mqar"), std::string::npos) << message_of(shards);
}

TEST(StageRule, StableOnlyWhenTheWindowMeansAgree) {
  const StabilityRule rule{.window = 3, .tolerance = 0.01};
  EXPECT_FALSE(loss_is_stable(std::vector<double>{}, rule));
  EXPECT_FALSE(loss_is_stable(std::vector<double>{1, 1, 1, 1, 1}, rule));  // fewer than 2W
  EXPECT_TRUE(loss_is_stable(std::vector<double>{1, 1, 1, 1, 1, 1}, rule));
  // Falling 10% per window: not stable; within 0.5%: stable.
  EXPECT_FALSE(loss_is_stable(std::vector<double>{2.0, 2.0, 2.0, 1.8, 1.8, 1.8}, rule));
  EXPECT_TRUE(loss_is_stable(std::vector<double>{2.0, 2.0, 2.0, 1.99, 1.995, 1.996}, rule));
  // Only the last 2W count: an early drop is forgotten.
  EXPECT_TRUE(loss_is_stable(std::vector<double>{9, 5, 3, 1, 1, 1, 1, 1, 1}, rule));
  // Noise that averages out is stable.
  EXPECT_TRUE(loss_is_stable(std::vector<double>{1.1, 0.9, 1.0, 0.9, 1.1, 1.0}, rule));
  EXPECT_FALSE(loss_is_stable(std::vector<double>{1, 1, 1, NAN, 1, 1}, rule));

  const StageConfig stage{.seq_len = 16, .min_steps = 4, .max_steps = 10};
  const std::vector<double> flat(6, 1.0), falling = {6, 5, 4, 3, 2, 1};
  EXPECT_EQ(stage_end(stage, rule, 3, flat), StageEnd::kNone);  // before min_steps
  EXPECT_EQ(stage_end(stage, rule, 6, flat), StageEnd::kStable);
  EXPECT_EQ(stage_end(stage, rule, 6, falling), StageEnd::kNone);
  EXPECT_EQ(stage_end(stage, rule, 10, falling), StageEnd::kMaxSteps);
  EXPECT_EQ(stage_end_name(StageEnd::kStable), "stable");
  EXPECT_EQ(stage_end_name(StageEnd::kMaxSteps), "max_steps");

  // A target loss ends the stage on the last window's mean, and a plateau above it never does.
  const StageConfig target{.seq_len = 16, .min_steps = 4, .max_steps = 10, .target_loss = 1.5};
  EXPECT_EQ(stage_end(target, rule, 6, std::vector<double>(6, 2.0)), StageEnd::kNone);  // stable
  EXPECT_EQ(stage_end(target, rule, 6, flat), StageEnd::kTargetLoss);
  EXPECT_EQ(stage_end(target, rule, 3, falling), StageEnd::kNone);                    // min_steps
  EXPECT_EQ(stage_end(target, rule, 6, std::vector<double>{1, 1}), StageEnd::kNone);  // < W
  EXPECT_EQ(stage_end(target, rule, 6, falling), StageEnd::kNone);                    // mean 2
  EXPECT_EQ(stage_end(target, rule, 6, std::vector<double>{6, 5, 4, 2, 1, 1}),
            StageEnd::kTargetLoss);  // mean 4/3
  EXPECT_EQ(stage_end(target, rule, 10, std::vector<double>{3, 3, 3}), StageEnd::kMaxSteps);
  EXPECT_EQ(stage_end_name(StageEnd::kTargetLoss), "target_loss");
}

TEST(StageRule, PositionBucketsDouble) {
  auto b = position_buckets(100, 16);
  ASSERT_EQ(b.size(), 4u);
  EXPECT_EQ(b[0].begin, 0);
  EXPECT_EQ(b[0].end, 16);
  EXPECT_EQ(b[1].end, 32);
  EXPECT_EQ(b[2].end, 64);
  EXPECT_EQ(b[3].begin, 64);
  EXPECT_EQ(b[3].end, 100);
  EXPECT_EQ(position_buckets(16, 256).size(), 1u);
  EXPECT_EQ(position_buckets(16, 256)[0].end, 16);
}

std::vector<float> logits_of(const Model& model, const std::vector<int32_t>& tokens) {
  SequenceCache cache = model.new_cache();
  ForwardBatch batch;
  batch.token_ids = tokens;
  batch.seqs.push_back({.num_tokens = static_cast<int64_t>(tokens.size()),
                        .logits = LogitsMode::kAll,
                        .cache = &cache});
  auto out = model.forward(batch);
  EXPECT_TRUE(out.ok()) << out.status();
  if (!out.ok()) return {};
  return std::vector<float>(out->data<float>(), out->data<float>() + out->numel());
}

TEST(RopeTheta, ChangesTheLogitsAndBackRestoresThem) {
  auto model = Model::load(loom::testing::kFixtures + "/qwen3_next_s0");
  ASSERT_TRUE(model.ok()) << model.status();
  std::mt19937 rng(5);
  const std::vector<int32_t> tokens = loom::testing::random_prompt(24, rng);
  const double theta = (*model)->config().rope.theta;
  const std::vector<float> before = logits_of(**model, tokens);
  EXPECT_EQ((*model)->set_rope_theta(theta * 50), 1);  // one GQA layer rotates
  EXPECT_EQ((*model)->config().rope.theta, theta * 50);
  const std::vector<float> changed = logits_of(**model, tokens);
  ASSERT_EQ(changed.size(), before.size());
  EXPECT_NE(std::memcmp(changed.data(), before.data(), before.size() * sizeof(float)), 0);
  EXPECT_EQ((*model)->set_rope_theta(theta), 1);
  const std::vector<float> again = logits_of(**model, tokens);
  ASSERT_EQ(again.size(), before.size());
  EXPECT_EQ(std::memcmp(again.data(), before.data(), before.size() * sizeof(float)), 0);

  // A model without rotary layers (Kimi Linear's MLA is NoPE) ignores it.
  auto kda = Model::load(loom::testing::kFixtures + "/kimi_linear_s0");
  ASSERT_TRUE(kda.ok()) << kda.status();
  EXPECT_EQ((*kda)->set_rope_theta(1e6), 0);
}

TEST(RowLoss, PerPositionLossesAverageToTheLoss) {
  auto model = Model::load(loom::testing::kFixtures + "/fla_kda_s0", Placement{.trainable = true});
  ASSERT_TRUE(model.ok()) << model.status();
  std::mt19937 rng(9);
  const std::vector<int32_t> tokens = loom::testing::random_prompt(20, rng);
  std::vector<uint8_t> mask(tokens.size(), 1);
  mask[3] = mask[7] = 0;
  mask.back() = 0;
  Gradients g1, g2;
  auto plain = (*model)->loss_and_gradients(tokens, g1, mask);
  std::vector<float> rows;
  auto with_rows = (*model)->loss_and_gradients(tokens, g2, mask, &rows);
  ASSERT_TRUE(plain.ok() && with_rows.ok());
  EXPECT_EQ(*plain, *with_rows);  // the same bits
  ASSERT_EQ(rows.size(), tokens.size());
  double sum = 0;
  int n = 0;
  for (size_t t = 0; t + 1 < rows.size(); ++t) {
    if (mask[t] == 0) {
      EXPECT_EQ(rows[t], 0.0f) << t;
      continue;
    }
    EXPECT_GT(rows[t], 0.0f);
    sum += rows[t];
    ++n;
  }
  EXPECT_EQ(rows.back(), 0.0f);
  EXPECT_NEAR(sum / n, *plain, 1e-5);
}

TEST(StagedRun, SwitchesStageLogsBucketsAndResumesExactly) {
  const std::string a = tmp("a"), b = tmp("b");
  auto whole = parse_run_config(staged_run(a).dump());
  ASSERT_TRUE(whole.ok()) << whole.status();
  auto summary = run_training(*whole, nullptr);
  ASSERT_TRUE(summary.ok()) << summary.status();
  // Stage 0 cannot be stable (tolerance 1e-12) before its max_steps 3; stage 1 runs its 4.
  EXPECT_EQ(summary->steps, 7);
  const std::vector<json> lines = lines_in(a);
  ASSERT_EQ(lines.size(), 7u);
  for (int i = 0; i < 7; ++i) {
    const json& l = lines[i];
    EXPECT_EQ(l["stage"], i < 3 ? 0 : 1) << l;
    EXPECT_EQ(l["seq_len"], i < 3 ? 16 : 32) << l;
    // Buckets [0, 8), [8, 16) and, at 32 tokens, [16, 32); MQAR scores the recalled values,
    // which sit in the second half of the sequence.
    const json& buckets = l["loss_by_position"];
    ASSERT_EQ(buckets.size(), i < 3 ? 2u : 3u) << l;
    EXPECT_EQ(buckets[0]["begin"], 0);
    EXPECT_EQ(buckets[0]["end"], 8);
    EXPECT_EQ(buckets.back()["end"], i < 3 ? 16 : 32);
    double weighted = 0;
    int64_t scored = 0;
    for (const json& bk : buckets) {
      scored += bk["tokens"].get<int64_t>();
      if (!bk["loss"].is_null()) weighted += bk["loss"].get<double>() * bk["tokens"].get<int64_t>();
    }
    EXPECT_EQ(scored, 2 * (i < 3 ? 3 : 6)) << l;  // batch 2 x pairs
    EXPECT_GT(weighted, 0);
  }
  EXPECT_EQ(lines[2]["stage_ended"], "max_steps");
  EXPECT_EQ(lines[6]["stage_ended"], "max_steps");
  EXPECT_FALSE(lines[3].contains("stage_ended"));
  EXPECT_FALSE(lines[3].contains("rope_note"));  // qwen3_next rotates
  // The step-5 checkpoint (stage 1, two steps in) serves with the new RoPE base.
  const fs::path ckpt = fs::path(a) / "checkpoint-5";
  auto served = Model::load(ckpt.string());
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_EQ((*served)->config().rope.theta, 500000.0);

  json resumed = staged_run(b);
  resumed["model"] = {{"checkpoint", ckpt.string()}};
  auto rest = parse_run_config(resumed.dump());
  ASSERT_TRUE(rest.ok()) << rest.status();
  auto rest_summary = run_training(*rest, nullptr);
  ASSERT_TRUE(rest_summary.ok()) << rest_summary.status();
  const std::vector<json> again = lines_in(b);
  ASSERT_EQ(again.size(), 2u);  // stage 1's last two steps, then the run ends with the stage
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(again[i]["step"], 6 + i);
    EXPECT_EQ(again[i]["stage"], 1);
    EXPECT_EQ(again[i]["loss"].get<double>(), lines[5 + i]["loss"].get<double>())
        << "step " << 6 + i;
    EXPECT_EQ(again[i]["loss_by_position"], lines[5 + i]["loss_by_position"]);
  }
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST(StagedRun, StableLossEndsAStageEarlyAndRotaryFreeModelsSayWhy) {
  const std::string a = tmp("stable");
  json j = staged_run(a);
  j["model"]["config"] = loom::testing::kFixtures + "/kimi_linear_s0/config.json";  // NoPE
  j["stage_stability"] = {{"window", 1}, {"tolerance", 1e9}};  // anything is stable
  j["stages"][0]["min_steps"] = 2;
  j["stages"][0]["max_steps"] = 50;
  j["stages"][1]["min_steps"] = 2;
  j["stages"][1]["max_steps"] = 50;
  j["checkpoint_every"] = 0;
  auto c = parse_run_config(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  auto summary = run_training(*c, nullptr);
  ASSERT_TRUE(summary.ok()) << summary.status();
  const std::vector<json> lines = lines_in(a);
  ASSERT_EQ(lines.size(), 4u);  // 2 steps each: stable once min_steps have run
  EXPECT_EQ(lines[1]["stage_ended"], "stable");
  EXPECT_EQ(lines[3]["stage_ended"], "stable");
  EXPECT_EQ(lines[2]["rope_note"], "no rotary layers: rope_theta ignored");
  fs::remove_all(a);
}

TEST(StagedRun, TargetLossEndsAStageAndAPlateauDoesNot) {
  const std::string a = tmp("target");
  json j = staged_run(a);
  j["stage_stability"] = {{"window", 1}, {"tolerance", 1e9}};  // anything is stable
  j["stages"][0]["min_steps"] = 2;
  j["stages"][0]["max_steps"] = 3;
  j["stages"][0]["target_loss"] = 1e-6;  // out of reach: runs to max_steps although stable
  j["stages"][1]["min_steps"] = 2;
  j["stages"][1]["max_steps"] = 50;
  j["stages"][1]["target_loss"] = 1e6;  // reached at once: ends after min_steps
  j["checkpoint_every"] = 0;
  auto c = parse_run_config(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  auto summary = run_training(*c, nullptr);
  ASSERT_TRUE(summary.ok()) << summary.status();
  const std::vector<json> lines = lines_in(a);
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_FALSE(lines[1].contains("stage_ended"));
  EXPECT_EQ(lines[2]["stage_ended"], "max_steps");
  EXPECT_EQ(lines[4]["stage_ended"], "target_loss");
  fs::remove_all(a);
}

}  // namespace
}  // namespace loom
