// loom-trainer's run config and loop: every config mistake is an error naming its field; a short
// MQAR run writes one metrics line per step and servable checkpoints; a run resumed from its
// step-4 checkpoint repeats the uninterrupted run's steps 5-8 exactly; shards train too; tool-use
// dialogues train on exactly their masked assistant turns and the loss falls.
#include "trainer/train_run.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "engine/model/model.h"
#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/engine_test_support.h"
#include "trainer/run_config.h"
#include "trainer/stages.h"
#include "trainer/synthetic_tasks.h"
#include "trainer/token_shard.h"
#include "trainer/tool_dialogues.h"
#include "weights/model_config.h"
#include "weights/weight_loader.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string tmp(const std::string& name) {
  return std::string(LOOM_TEST_TMPDIR) + "/train_run." + std::to_string(::getpid()) + "." + name;
}

json mqar_run(const std::string& out) {
  return {
      {"model", {{"config", loom::testing::kFixtures + "/fla_kda_s0/config.json"}, {"seed", 3}}},
      {"data",
       {{"task", "mqar"},
        {"seq_len", 16},
        {"mqar", {{"num_pairs", 3}, {"num_keys", 32}, {"value_begin", 33}, {"num_values", 32}}}}},
      {"batch_size", 2},
      {"steps", 8},
      {"checkpoint_every", 4},
      {"optimizer", {{"peak_lr", 3e-3}, {"min_lr", 3e-4}, {"warmup_steps", 2}}},
      {"out", out},
      {"seed", 7}};
}

// Every line of a run's metrics.jsonl, parsed.
std::vector<json> metrics_of(const std::string& run) {
  std::vector<json> out;
  std::ifstream f(fs::path(run) / "metrics.jsonl");
  std::string line;
  while (std::getline(f, line)) out.push_back(json::parse(line));
  return out;
}

std::vector<double> losses_in(const std::string& run) {
  std::vector<double> out;
  for (const json& m : metrics_of(run)) out.push_back(m["loss"].get<double>());
  return out;
}

TEST(RunConfig, NamesTheFieldOfEveryMistake) {
  const json good = mqar_run("/tmp/x");
  ASSERT_TRUE(parse_run_config(good.dump()).ok()) << parse_run_config(good.dump()).status();
  auto message_of = [](const json& j) {
    return std::string(parse_run_config(j.dump()).status().message());
  };
  json j = good;
  j["bogus"] = 1;
  EXPECT_NE(message_of(j).find("run.bogus"), std::string::npos) << message_of(j);
  j = good;
  j["optimizer"]["lrr"] = 1;
  EXPECT_NE(message_of(j).find("optimizer.lrr"), std::string::npos);
  j = good;
  j["batch_size"] = "8";
  EXPECT_NE(message_of(j).find("run.batch_size"), std::string::npos);
  j = good;
  j["batch_size"] = 0;
  EXPECT_NE(message_of(j).find("run.batch_size"), std::string::npos);
  j = good;
  j["device"] = "gpu";
  EXPECT_NE(message_of(j).find("run.device"), std::string::npos) << message_of(j);
  j = good;
  j["device"] = "cuda:1";
  ASSERT_TRUE(parse_run_config(j.dump()).ok());
  EXPECT_EQ(parse_run_config(j.dump())->device, Device::cuda(1));
  EXPECT_EQ(parse_run_config(good.dump())->device, Device::kCpu);
  EXPECT_EQ(parse_run_config(good.dump())->matmul, MatmulPrecision::kF32);
  for (const auto& [name, precision] :
       {std::pair{"tf32", MatmulPrecision::kTf32}, std::pair{"bf16", MatmulPrecision::kBf16}}) {
    j = good;
    j["matmul"] = name;  // the CPU has neither
    EXPECT_NE(message_of(j).find("run.matmul"), std::string::npos) << message_of(j);
    EXPECT_NE(message_of(j).find("CUDA"), std::string::npos) << message_of(j);
    j["device"] = "cuda";
    ASSERT_TRUE(parse_run_config(j.dump()).ok()) << name;
    EXPECT_EQ(parse_run_config(j.dump())->matmul, precision) << name;
  }
  j["matmul"] = "fp16";
  EXPECT_NE(message_of(j).find("run.matmul"), std::string::npos) << message_of(j);
  j = good;
  j["model"]["checkpoint"] = "/x";
  EXPECT_NE(message_of(j).find("exactly one"), std::string::npos);
  j = good;
  j["data"]["seq_len"] = 8;  // 3 pairs need 12 tokens
  EXPECT_NE(message_of(j).find("mqar"), std::string::npos);
  j = good;
  j["data"]["task"] = "books";
  EXPECT_NE(message_of(j).find("data.task"), std::string::npos);
  j = good;
  j["seed"] = -1;
  EXPECT_NE(message_of(j).find("run.seed"), std::string::npos);
  j = good;
  j["optimizer"]["warmup_steps"] = 50;  // past the 8-step schedule
  EXPECT_NE(message_of(j).find("warmup_steps"), std::string::npos);
  j = good;
  j["data"]["loss"] = "tokens";
  EXPECT_NE(message_of(j).find("data.loss"), std::string::npos) << message_of(j);
  EXPECT_FALSE(parse_run_config(good.dump())->score_all_tokens);
  j = good;
  j["data"]["loss"] = "all";
  ASSERT_TRUE(parse_run_config(j.dump()).ok());
  EXPECT_TRUE(parse_run_config(j.dump())->score_all_tokens);
  EXPECT_FALSE(parse_run_config(good.dump())->mqar.spread);
  j = good;
  j["data"]["mqar"]["spread"] = true;
  ASSERT_TRUE(parse_run_config(j.dump()).ok());
  EXPECT_TRUE(parse_run_config(j.dump())->mqar.spread);
  j["data"]["mqar"]["spread"] = 1;
  EXPECT_NE(message_of(j).find("data.mqar.spread"), std::string::npos) << message_of(j);
  EXPECT_FALSE(parse_run_config("{not json").ok());
  EXPECT_EQ(load_run_config(tmp("missing.json")).status().code(), absl::StatusCode::kNotFound);
}

TEST(TrainRun, ResumesFromItsCheckpointExactly) {
  const std::string a = tmp("a"), b = tmp("b");
  auto whole = parse_run_config(mqar_run(a).dump());
  ASSERT_TRUE(whole.ok()) << whole.status();
  auto summary = run_training(*whole, nullptr);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->steps, 8);
  EXPECT_TRUE(fs::exists(fs::path(a) / "checkpoint-4" / "trainer_state.safetensors"));
  EXPECT_EQ(summary->last_checkpoint, (fs::path(a) / "checkpoint-8").string());
  const std::vector<double> losses = losses_in(a);
  ASSERT_EQ(losses.size(), 8u);
  // The checkpoint serves as it is.
  EXPECT_TRUE(Model::load(summary->last_checkpoint).ok());

  json resumed = mqar_run(b);
  resumed["model"] = {{"checkpoint", (fs::path(a) / "checkpoint-4").string()}};
  resumed["steps"] = 4;
  resumed["checkpoint_every"] = 0;
  resumed["optimizer"]["total_steps"] = 8;  // the same schedule as the whole run
  auto rest = parse_run_config(resumed.dump());
  ASSERT_TRUE(rest.ok()) << rest.status();
  ASSERT_TRUE(run_training(*rest, nullptr).ok());
  const std::vector<double> again = losses_in(b);
  ASSERT_EQ(again.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(again[i], losses[4 + i]) << "step " << 5 + i;
  fs::remove_all(a);
  fs::remove_all(b);
}

// MQAR examples train without the padding after their queries (3 pairs: 12 of the 16 tokens), and
// data.loss "all" scores every next token of what is left. The oracle draws the run's examples by
// hand from its seed (7) and takes the model's loss on each, their mean the first step's loss.
TEST(TrainRun, MqarDropsItsPaddingAndCanScoreEveryToken) {
  for (const bool all : {false, true}) {
    const std::string out = tmp(all ? "mqar_all" : "mqar_answers");
    json j = mqar_run(out);
    j["steps"] = 2;
    j["checkpoint_every"] = 0;
    j["optimizer"]["warmup_steps"] = 0;
    if (all) j["data"]["loss"] = "all";
    auto cfg = parse_run_config(j.dump());
    ASSERT_TRUE(cfg.ok()) << cfg.status();
    ASSERT_TRUE(run_training(*cfg, nullptr).ok());

    auto model_cfg = load_model_config(loom::testing::kFixtures + "/fla_kda_s0");
    ASSERT_TRUE(model_cfg.ok()) << model_cfg.status();
    auto model = Model::load(*model_cfg, WeightLoader::synthetic(*model_cfg, 3));
    ASSERT_TRUE(model.ok()) << model.status();
    std::mt19937_64 rng(7);
    double want = 0;
    for (int b = 0; b < 2; ++b) {
      Example ex = make_mqar(cfg->mqar, rng);
      EXPECT_EQ(ex.tokens.size(), 16u);
      drop_unscored_tail(ex);
      EXPECT_EQ(ex.tokens.size(), 12u);  // 3 pairs, 3 queries with their values
      EXPECT_EQ(ex.scored(), 3);
      if (all) score_all_tokens(ex);
      Gradients unused;
      auto loss = (*model)->loss_and_gradients(ex.tokens, unused, ex.loss_mask);
      ASSERT_TRUE(loss.ok()) << loss.status();
      want += *loss / 2.0;
    }
    std::ifstream f(fs::path(out) / "metrics.jsonl");
    std::string line;
    ASSERT_TRUE(std::getline(f, line));
    const json m = json::parse(line);
    EXPECT_EQ(m["tokens"].get<int64_t>(), 24);
    EXPECT_NEAR(m["loss"].get<double>(), want, 1e-5 * want) << (all ? "all" : "answers");
    fs::remove_all(out);
  }
}

TEST(TrainRun, TrainsOnShards) {
  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> tok(0, 383);
  TokenShardWriter w;
  for (int d = 0; d < 4; ++d) {
    std::vector<int32_t> doc(50);
    for (int32_t& t : doc) t = tok(rng);
    ASSERT_TRUE(w.add_document(doc).ok());
  }
  const std::string shard = tmp("shard");
  ASSERT_TRUE(w.write(shard).ok());
  json j = mqar_run(tmp("shards"));
  j["data"] = {{"task", "shards"}, {"shards", {shard}}, {"seq_len", 24}};
  j["steps"] = 3;
  auto cfg = parse_run_config(j.dump());
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  auto summary = run_training(*cfg, nullptr);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(losses_in(tmp("shards")).size(), 3u);
  EXPECT_TRUE(std::isfinite(summary->last_loss));
  // A shard whose ids the model cannot embed is refused before any step.
  TokenShardWriter big;
  ASSERT_TRUE(big.add_document(std::vector<int32_t>(30, 5000)).ok());
  ASSERT_TRUE(big.write(shard).ok());
  EXPECT_NE(run_training(*cfg, nullptr).status().message().find("vocabulary"), std::string::npos);
  fs::remove_all(tmp("shards"));
  fs::remove(shard);
}

json tool_run(const std::string& out) {
  json j = mqar_run(out);
  j["data"] = {{"task", "tool_dialogue"},
               {"seq_len", 1024},
               {"tokenizer", "byte"},
               {"tool_dialogue", {{"max_turns", 1}, {"registry_size", 4}}}};
  return j;
}

TEST(RunConfig, ToolDialogueFields) {
  auto c = parse_run_config(tool_run("/tmp/x").dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->task, "tool_dialogue");
  EXPECT_EQ(c->tokenizer, "byte");
  EXPECT_EQ(c->tool_dialogue.max_turns, 1);
  EXPECT_EQ(c->tool_dialogue.registry_size, 4);
  EXPECT_EQ(c->tool_dialogue.max_operand, ToolDialogueOptions{}.max_operand);
  // A stage overrides the mix; the rest comes from data.tool_dialogue.
  json staged = tool_run("/tmp/x");
  staged["stages"] = {{{"seq_len", 1024}, {"max_steps", 2}},
                      {{"seq_len", 2048}, {"max_steps", 2}, {"tool_dialogue", {{"max_turns", 3}}}}};
  c = parse_run_config(staged.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->stages[0].tool_dialogue.max_turns, 1);
  EXPECT_EQ(c->stages[1].tool_dialogue.max_turns, 3);
  EXPECT_EQ(c->stages[1].tool_dialogue.registry_size, 4);

  struct Case {
    std::function<void(json&)> edit;
    std::string field;
  };
  const Case cases[] = {
      {[](json& j) { j["data"]["tool_dialogue"]["max_turns"] = 0; }, "data.tool_dialogue"},
      {[](json& j) { j["data"]["tool_dialogue"]["turns"] = 2; }, "data.tool_dialogue.turns"},
      {[](json& j) { j["data"]["tool_dialogue"]["registry_size"] = "4"; },
       "data.tool_dialogue.registry_size"},
      {[](json& j) { j["data"]["tokenizer"] = ""; }, "data.tokenizer"},
      {[](json& j) {
         j["data"]["mqar"] = {{"num_pairs", 2}};
       },
       "data.mqar"},
      {[](json& j) {
         j["stages"] = {{{"seq_len", 1024}, {"max_steps", 2}, {"mqar", {{"num_pairs", 2}}}}};
       },
       "stages[0].mqar"},
      {[](json& j) {
         j["stages"] = {
             {{"seq_len", 64}, {"max_steps", 2}, {"tool_dialogue", {{"max_turns", 99}}}}};
       },
       "stages[0].tool_dialogue"},
  };
  for (const Case& k : cases) {
    json j = tool_run("/tmp/x");
    k.edit(j);
    const std::string m(parse_run_config(j.dump()).status().message());
    EXPECT_NE(m.find(k.field), std::string::npos) << k.field << ": " << m;
  }
  // Another task's fields are refused rather than ignored.
  json mqar = mqar_run("/tmp/x");
  mqar["data"]["tool_dialogue"] = {{"max_turns", 2}};
  EXPECT_NE(parse_run_config(mqar.dump()).status().message().find("data.tool_dialogue"),
            std::string::npos);
  mqar = mqar_run("/tmp/x");
  mqar["data"]["tokenizer"] = "byte";
  EXPECT_NE(parse_run_config(mqar.dump()).status().message().find("data.tokenizer"),
            std::string::npos);
}

// fla_kda_s0 (KDA, GQA, dense FFNs; model_type kda: the native chat format) on one-exchange tool
// dialogues through the byte-level tokenizer, about 600 tokens each of which 80-95 are scored.
// The first step's loss is exactly the model's masked loss on the examples the task draws from
// the run's seed (the assistant turns, nothing else), and the loss falls: measured 6.116 at step 1
// and 1.79 over steps 10-12 (0.29 of it; a 30-step run reaches 0.5), asserted below half.
TEST(TrainRun, TrainsOnToolDialogues) {
  const std::string out = tmp("tool");
  json j = tool_run(out);
  j["steps"] = 12;
  j["checkpoint_every"] = 0;
  auto cfg = parse_run_config(j.dump());
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  auto summary = run_training(*cfg, nullptr);
  ASSERT_TRUE(summary.ok()) << summary.status();
  const std::vector<double> losses = losses_in(out);
  ASSERT_EQ(losses.size(), 12u);

  // The oracle: the same model and seeds, the examples drawn by hand.
  auto model_cfg = load_model_config(loom::testing::kFixtures + "/fla_kda_s0");
  ASSERT_TRUE(model_cfg.ok()) << model_cfg.status();
  auto model = Model::load(*model_cfg, WeightLoader::synthetic(*model_cfg, 3));
  ASSERT_TRUE(model.ok()) << model.status();
  const auto tok = Tokenizer::byte_level();
  std::mt19937_64 rng(7);
  double want = 0;
  for (int b = 0; b < 2; ++b) {
    auto ex = make_tool_dialogue_example(*tok, ChatFormat::kNative,
                                         make_tool_dialogue(cfg->tool_dialogue, rng));
    ASSERT_TRUE(ex.ok()) << ex.status();
    ASSERT_GT(ex->scored(), 0);
    ASSERT_LT(ex->scored(), static_cast<int64_t>(ex->tokens.size()) / 4);  // the replies only
    Gradients unused;
    auto loss = (*model)->loss_and_gradients(ex->tokens, unused, ex->loss_mask);
    ASSERT_TRUE(loss.ok()) << loss.status();
    want += *loss / 2.0;
  }
  // The run packs each batch into one pass (max_tokens_per_pass): f32 summation order against
  // these per-example calls (tests/unit/packed_training_test.cc).
  EXPECT_NEAR(losses[0], want, 1e-5 * want);

  const double last = (losses[9] + losses[10] + losses[11]) / 3;
  std::printf("[train run] tool dialogues: step 1 loss %.4f, steps 10-12 %.4f (%.2f of it)\n",
              losses[0], last, last / losses[0]);
  EXPECT_LT(last, 0.5 * losses[0]);
  // With the byte-level tokenizer the checkpoint carries no tokenizer file: it is served and
  // evaluated with the byte-level one, as it was trained.
  EXPECT_FALSE(fs::exists(fs::path(summary->last_checkpoint) / "tokenizer.json"));
  fs::remove_all(out);
}

// A stage's tool_dialogue mix is the one drawn from while it runs: each step's token count is the
// count of the examples drawn by hand with that stage's options (one exchange, then up to three).
TEST(TrainRun, ToolDialogueStagesDrawTheirOwnMix) {
  const std::string out = tmp("tool_stages");
  json j = tool_run(out);
  j["stages"] = {{{"seq_len", 1024}, {"max_steps", 2}},
                 {{"seq_len", 4096}, {"max_steps", 2}, {"tool_dialogue", {{"max_turns", 3}}}}};
  j["checkpoint_every"] = 0;
  j["optimizer"]["warmup_steps"] = 0;
  auto cfg = parse_run_config(j.dump());
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  ASSERT_TRUE(run_training(*cfg, nullptr).ok());
  const auto tok = Tokenizer::byte_level();
  std::mt19937_64 rng(7);
  int step = 0;
  bool longer = false;
  for (const json& m : metrics_of(out)) {
    const ToolDialogueOptions& o = cfg->stages[step < 2 ? 0 : 1].tool_dialogue;
    int64_t want = 0;
    for (int b = 0; b < 2; ++b) {
      auto ex = make_tool_dialogue_example(*tok, ChatFormat::kNative, make_tool_dialogue(o, rng));
      ASSERT_TRUE(ex.ok()) << ex.status();
      want += static_cast<int64_t>(ex->tokens.size());
      longer |= ex->tokens.size() > 1024;
    }
    EXPECT_EQ(m["tokens"].get<int64_t>(), want) << "step " << step + 1;
    EXPECT_EQ(m["stage"].get<int>(), step < 2 ? 0 : 1);
    ++step;
  }
  EXPECT_EQ(step, 4);
  EXPECT_TRUE(longer) << "the second stage drew no multi-exchange dialogue; the check is empty";
  fs::remove_all(out);
}

// A stage's own mix: the first stage draws only tool dialogues, the second only passkeys (the
// dialogue's weight 0), and every step's token count is what those draws give from the run's seed.
TEST(TrainRun, MixStagesDrawTheirOwnTasks) {
  const std::string out = tmp("mix_stages");
  json j = tool_run(out);
  j["data"]["task"] = "mix";
  j["data"]["mix"] = {{{"task", "passkey"}, {"weight", 1}},
                      {{"task", "tool_dialogue"}, {"weight", 1}}};
  j["stages"] = {
      {{"seq_len", 1024}, {"max_steps", 2}, {"mix", {{{"task", "tool_dialogue"}, {"weight", 1}}}}},
      {{"seq_len", 512},
       {"max_steps", 2},
       {"mix",
        {{{"task", "passkey"}, {"weight", 2}}, {{"task", "tool_dialogue"}, {"weight", 0}}}}}};
  j["checkpoint_every"] = 0;
  j["optimizer"]["warmup_steps"] = 0;
  auto cfg = parse_run_config(j.dump());
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->stages[0].mix_weights, (std::vector<double>{0, 1}));
  EXPECT_EQ(cfg->stages[1].mix_weights, (std::vector<double>{2, 0}));
  ASSERT_TRUE(run_training(*cfg, nullptr).ok());
  const auto tok = Tokenizer::byte_level();
  std::mt19937_64 rng(7);
  int step = 0;
  for (const json& m : metrics_of(out)) {
    const StageConfig& stage = cfg->stages[step < 2 ? 0 : 1];
    std::discrete_distribution<size_t> pick(stage.mix_weights.begin(), stage.mix_weights.end());
    int64_t want = 0;
    for (int b = 0; b < 2; ++b) {
      const size_t task = pick(rng);
      ASSERT_EQ(task, step < 2 ? 1u : 0u) << "step " << step + 1;
      absl::StatusOr<Example> ex =
          task == 1 ? make_tool_dialogue_example(*tok, ChatFormat::kNative,
                                                 make_tool_dialogue(stage.tool_dialogue, rng))
                    : draw_passkey(*tok, stage.passkey, stage.seq_len, rng);
      ASSERT_TRUE(ex.ok()) << ex.status();
      want += static_cast<int64_t>(ex->tokens.size());
    }
    EXPECT_EQ(m["tokens"].get<int64_t>(), want) << "step " << step + 1;
    ++step;
  }
  EXPECT_EQ(step, 4);
  // What a stage's mix may not be.
  for (const auto& [mix, field] : std::vector<std::pair<json, std::string>>{
           {{{{"task", "mqar"}, {"weight", 1}}}, "stages[0].mix[0].task"},
           {{{{"task", "passkey"}, {"weight", 0}}}, "stages[0].mix"},
           {{{{"task", "passkey"}, {"weight", -1}}}, "stages[0].mix[0].weight"},
           {{{{"task", "passkey"}}}, "stages[0].mix[0].weight"},
           {{{{"task", "passkey"}, {"weight", 1}}, {{"task", "passkey"}, {"weight", 1}}},
            "stages[0].mix[1].task"},
           {json::array(), "stages[0].mix"}}) {
    json bad = j;
    bad["stages"][0]["mix"] = mix;
    const auto r = parse_run_config(bad.dump());
    ASSERT_FALSE(r.ok()) << mix.dump();
    EXPECT_NE(r.status().message().find(field), std::string::npos) << r.status();
  }
  json not_mix = tool_run(out);
  not_mix["stages"] = {
      {{"seq_len", 1024}, {"max_steps", 1}, {"mix", {{{"task", "tool_dialogue"}, {"weight", 1}}}}}};
  const auto r = parse_run_config(not_mix.dump());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("only for data.task mix"), std::string::npos) << r.status();
  fs::remove_all(out);
}

TEST(TrainRun, RefusesToolDialoguesThatDoNotFit) {
  // Longer than seq_len: refused, naming what to change.
  json j = tool_run(tmp("short"));
  j["data"]["seq_len"] = 200;
  j["steps"] = 4;
  auto cfg = parse_run_config(j.dump());
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  auto run = run_training(*cfg, nullptr);
  EXPECT_NE(run.status().message().find("longer than seq_len 200"), std::string::npos)
      << run.status();
  // A tokenizer whose ids the model cannot embed (Qwen's 151k vocabulary, a 384-token model).
  j = tool_run(tmp("big"));
  j["data"]["tokenizer"] = loom::testing::kFixtures + "/tokenizer_qwen";
  cfg = parse_run_config(j.dump());
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  run = run_training(*cfg, nullptr);
  EXPECT_NE(run.status().message().find("do not fit the model's vocabulary of 384"),
            std::string::npos)
      << run.status();
  fs::remove_all(tmp("short"));
  fs::remove_all(tmp("big"));
}

}  // namespace
}  // namespace loom
