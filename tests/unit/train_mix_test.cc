// loom-trainer's passkey task and task mixes (data.task "passkey" and "mix"): every config mistake
// names its field; a mixed run draws exactly the examples a hand-built draw from the same seed
// gives (tasks in proportion to the weights, passkeys of every length and depth that fit), trains
// on their masked answers only, and refuses a min_context too short for the task's own sentences.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "engine/chat/chat_template.h"
#include "engine/model/model.h"
#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/engine_test_support.h"
#include "trainer/run_config.h"
#include "trainer/synthetic_tasks.h"
#include "trainer/tool_dialogues.h"
#include "trainer/train_run.h"
#include "weights/model_config.h"
#include "weights/weight_loader.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string tmp(const std::string& name) {
  return std::string(LOOM_TEST_TMPDIR) + "/train_mix." + std::to_string(::getpid()) + "." + name;
}

// fla_kda_s0 (KDA, GQA, dense FFNs, a 384-token vocabulary) with the byte-level tokenizer:
// passkeys of 300 to 1018 tokens and one-exchange tool dialogues (~600 tokens), three to one.
json mix_run(const std::string& out) {
  return {
      {"model", {{"config", loom::testing::kFixtures + "/fla_kda_s0/config.json"}, {"seed", 3}}},
      {"data",
       {{"task", "mix"},
        {"seq_len", 1024},
        {"tokenizer", "byte"},
        {"mix", {{{"task", "passkey"}, {"weight", 3}}, {{"task", "tool_dialogue"}}}},
        {"passkey", {{"min_context", 300}}},
        {"tool_dialogue", {{"max_turns", 1}, {"registry_size", 4}}}}},
      {"batch_size", 2},
      {"steps", 2},
      {"optimizer", {{"peak_lr", 3e-3}, {"min_lr", 3e-4}, {"warmup_steps", 0}}},
      {"out", out},
      {"seed", 2}};
}

TEST(RunConfig, PasskeyAndMixFields) {
  auto c = parse_run_config(mix_run("/tmp/x").dump());
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->mix.size(), 2u);
  EXPECT_EQ(c->mix[0].task, "passkey");
  EXPECT_EQ(c->mix[0].weight, 3);
  EXPECT_EQ(c->mix[1].task, "tool_dialogue");
  EXPECT_EQ(c->mix[1].weight, 1);
  EXPECT_EQ(c->passkey.min_context, 300);
  EXPECT_EQ(c->passkey.digits, PasskeyTrainOptions{}.digits);
  EXPECT_TRUE(run_uses_task(*c, "passkey"));
  EXPECT_FALSE(run_uses_task(*c, "mqar"));
  // The passkey task alone, with its defaults; a stage overrides them for its own length.
  json pk = mix_run("/tmp/x");
  pk["data"] = {{"task", "passkey"}, {"seq_len", 512}};
  pk["stages"] = {{{"seq_len", 512}, {"max_steps", 2}},
                  {{"seq_len", 2048}, {"max_steps", 2}, {"passkey", {{"min_context", 1500}}}}};
  c = parse_run_config(pk.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->passkey.min_context, 256);
  EXPECT_EQ(c->stages[0].passkey.min_context, 256);
  EXPECT_EQ(c->stages[1].passkey.min_context, 1500);

  struct Case {
    std::function<void(json&)> edit;
    std::string field;
  };
  const Case cases[] = {
      {[](json& j) { j["data"].erase("mix"); }, "data.mix"},
      {[](json& j) { j["data"]["mix"] = json::array(); }, "data.mix"},
      {[](json& j) { j["data"]["mix"][0]["task"] = "shards"; }, "data.mix[0].task"},
      {[](json& j) { j["data"]["mix"][1]["weight"] = 0; }, "data.mix[1].weight"},
      {[](json& j) { j["data"]["mix"][1]["weight"] = "1"; }, "data.mix[1].weight"},
      {[](json& j) { j["data"]["mix"][1]["task"] = "passkey"; }, "data.mix[1].task"},
      {[](json& j) { j["data"]["mix"][1]["share"] = 1; }, "data.mix[1].share"},
      {[](json& j) { j["data"]["task"] = "passkey"; }, "data.mix"},
      {[](json& j) { j["data"]["passkey"]["digits"] = 0; }, "data.passkey"},
      {[](json& j) { j["data"]["passkey"]["min_context"] = 1019; }, "data.passkey"},
      {[](json& j) { j["data"]["passkey"]["depth"] = 0.5; }, "data.passkey.depth"},
      {[](json& j) {
         j["data"]["mqar"] = {{"num_pairs", 2}};
       },
       "data.mqar"},
      {[](json& j) {
         j["data"]["mix"] = {{{"task", "mqar"}}};
         j["data"].erase("passkey");
         j["data"].erase("tool_dialogue");
       },
       "data.tokenizer"},
      {[](json& j) {
         j["data"]["mix"] = {{{"task", "tool_dialogue"}}};
         j["data"].erase("passkey");
         j["stages"] = {{{"seq_len", 1024}, {"max_steps", 2}, {"passkey", {{"digits", 3}}}}};
       },
       "stages[0].passkey"},
      {[](json& j) {  // 256-token passkeys do not fit 200-token sequences
         j["data"]["passkey"] = {{"min_context", 256}};
         j["stages"] = {{{"seq_len", 200}, {"max_steps", 2}}};
       },
       "stages[0].passkey"},
  };
  for (const Case& k : cases) {
    json j = mix_run("/tmp/x");
    k.edit(j);
    const std::string m(parse_run_config(j.dump()).status().message());
    EXPECT_NE(m.find(k.field), std::string::npos) << k.field << ": " << m;
  }
  // A mix with MQAR takes data.mqar.
  json with_mqar = mix_run("/tmp/x");
  with_mqar["data"]["mix"].push_back({{"task", "mqar"}, {"weight", 0.5}});
  with_mqar["data"]["mqar"] = {{"num_pairs", 4}};
  c = parse_run_config(with_mqar.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->mqar.num_pairs, 4);
}

// The oracle draws each step's examples by hand from the run's seed, in the run's order: the task
// from the weights, then the passkey (context and depth) or the dialogue.
TEST(TrainRun, TrainsOnAMixOfPasskeysAndToolDialogues) {
  const std::string out = tmp("mix");
  auto cfg = parse_run_config(mix_run(out).dump());
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  auto summary = run_training(*cfg, nullptr);
  ASSERT_TRUE(summary.ok()) << summary.status();

  auto model_cfg = load_model_config(loom::testing::kFixtures + "/fla_kda_s0");
  ASSERT_TRUE(model_cfg.ok()) << model_cfg.status();
  auto model = Model::load(*model_cfg, WeightLoader::synthetic(*model_cfg, 3));
  ASSERT_TRUE(model.ok()) << model.status();
  const auto tok = Tokenizer::byte_level();
  std::mt19937_64 rng(2);
  std::discrete_distribution<size_t> pick({3.0, 1.0});
  std::ifstream f(fs::path(out) / "metrics.jsonl");
  std::string line;
  int step = 0, passkeys = 0, dialogues = 0;
  int64_t shortest = INT64_MAX, longest = 0;
  while (std::getline(f, line)) {
    const json m = json::parse(line);
    int64_t want_tokens = 0;
    double want_loss = 0;
    for (int b = 0; b < 2; ++b) {
      absl::StatusOr<Example> ex;
      if (pick(rng) == 0) {
        ex = draw_passkey(*tok, cfg->passkey, 1024, rng);
        ASSERT_TRUE(ex.ok()) << ex.status();
        ++passkeys;
        shortest = std::min<int64_t>(shortest, ex->tokens.size());
        longest = std::max<int64_t>(longest, ex->tokens.size());
        EXPECT_EQ(ex->scored(), 6);  // the answer (a space, five digits), nothing else
      } else {
        ex = make_tool_dialogue_example(*tok, ChatFormat::kNative,
                                        make_tool_dialogue(cfg->tool_dialogue, rng));
        ASSERT_TRUE(ex.ok()) << ex.status();
        ++dialogues;
      }
      EXPECT_LE(ex->tokens.size(), 1024u);
      want_tokens += static_cast<int64_t>(ex->tokens.size());
      if (step == 0) {
        Gradients unused;
        auto loss = (*model)->loss_and_gradients(ex->tokens, unused, ex->loss_mask);
        ASSERT_TRUE(loss.ok()) << loss.status();
        want_loss += *loss / 2.0;
      }
    }
    EXPECT_EQ(m["tokens"].get<int64_t>(), want_tokens) << "step " << step + 1;
    if (step == 0) {
      // One packed pass against per-example calls: f32 summation order, to which fla_kda_s0 is
      // sensitive (tests/unit/packed_training_test.cc).
      EXPECT_NEAR(m["loss"].get<double>(), want_loss, 1e-5 * want_loss);
      std::printf("[train mix] first loss %.9g, per-example calls %.9g\n", m["loss"].get<double>(),
                  want_loss);
    }
    ++step;
  }
  EXPECT_EQ(step, 2);
  // The seed draws both tasks (else the check above covers one), passkeys of different lengths.
  EXPECT_GT(passkeys, 0);
  EXPECT_GT(dialogues, 0);
  EXPECT_LT(shortest, longest);
  // The byte-level tokenizer: the checkpoint carries no tokenizer file (served as trained).
  EXPECT_FALSE(fs::exists(fs::path(summary->last_checkpoint) / "tokenizer.json"));
  fs::remove_all(out);
}

TEST(TrainRun, RefusesPasskeyContextsShorterThanTheTask) {
  json j = mix_run(tmp("short"));
  j["data"]["passkey"]["min_context"] = 50;  // the task's own sentences take ~230 bytes
  auto cfg = parse_run_config(j.dump());
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  auto run = run_training(*cfg, nullptr);
  EXPECT_NE(run.status().message().find("data.passkey.min_context 50"), std::string::npos)
      << run.status();
  EXPECT_NE(run.status().message().find("shorter than the task's"), std::string::npos)
      << run.status();
  fs::remove_all(tmp("short"));
}

}  // namespace
}  // namespace loom
