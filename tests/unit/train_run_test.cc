// loom-trainer's run config and loop: every config mistake is an error naming its field; a short
// MQAR run writes one metrics line per step and servable checkpoints; a run resumed from its
// step-4 checkpoint repeats the uninterrupted run's steps 5-8 exactly; shards train too.
#include "trainer/train_run.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "engine/model/model.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/engine_test_support.h"
#include "trainer/run_config.h"
#include "trainer/token_shard.h"

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

std::vector<double> losses_in(const std::string& run) {
  std::vector<double> out;
  std::ifstream f(fs::path(run) / "metrics.jsonl");
  std::string line;
  while (std::getline(f, line)) out.push_back(json::parse(line)["loss"].get<double>());
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

}  // namespace
}  // namespace loom
