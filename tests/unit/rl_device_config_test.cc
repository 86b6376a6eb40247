// RL.json's device, engine.weight_dtype, time_limit_s, log_samples and warm_start.direct_share
// (trainer/run_config.h, issue 20's GPU half): parsed and validated as RUN.json's device is,
// unsupported combinations refused with the field named, and a short CPU run with a bf16 rollout
// engine (the trainer's f32 weights rounded at every sync) that a time limit ends after its first
// step, checkpoint and sample conversations written.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/model/model.h"
#include "nlohmann/json.hpp"
#include "trainer/rl/rl_run.h"
#include "trainer/run_config.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

json tiny_run(const std::string& out) {
  return {
      {"model",
       {{"config", std::string(LOOM_SOURCE_DIR) + "/tests/long/rl_tiny_config.json"}, {"seed", 1}}},
      {"env", {{"name", "arithmetic"}, {"arithmetic", {{"operands", 2}, {"max_operand", 2}}}}},
      {"rollout", {{"max_turns", 2}, {"max_turn_tokens", 24}, {"max_trajectory_tokens", 512}}},
      {"warm_start", {{"steps", 2}, {"batch_size", 2}, {"lr", 3e-3}}},
      {"groups_per_step", 2},
      {"group_size", 2},
      {"steps", 2},
      {"optimizer", {{"peak_lr", 5e-4}, {"min_lr", 5e-4}, {"warmup_steps", 0}}},
      {"balance", {{"method", "none"}}},
      {"out", out},
      {"seed", 3}};
}

absl::StatusOr<RlConfig> parse_with(json j) { return parse_rl_config(j.dump()); }

TEST(RlDeviceConfig, DeviceAndEngineDtypeParseAndRefuse) {
  const json base = tiny_run("/tmp/unused");
  auto plain = parse_with(base);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_TRUE(plain->device.is_cpu());
  EXPECT_EQ(plain->engine_weight_dtype, WeightDType::kF32);
  EXPECT_EQ(plain->time_limit_s, 0);

  json j = base;
  j["device"] = "cuda:1";
  j["engine"] = {{"weight_dtype", "bf16"}};
  j["time_limit_s"] = 240;
  auto gpu = parse_with(j);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ(gpu->device, Device::cuda(1));
  EXPECT_EQ(gpu->engine_weight_dtype, WeightDType::kBF16);
  EXPECT_EQ(gpu->time_limit_s, 240);

  auto refused = [&](json bad, const std::string& field) {
    auto c = parse_with(std::move(bad));
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_NE(c.status().message().find(field), std::string::npos) << c.status();
    return std::string(c.status().message());
  };
  j = base;
  j["device"] = "gpu";
  refused(j, "rl.device");
  j = base;
  j["device"] = 0;
  refused(j, "rl.device");
  for (const char* dtype : {"fp8", "auto", "f16"}) {
    j = base;
    j["engine"] = {{"weight_dtype", dtype}};
    refused(j, "engine.weight_dtype");
  }
  j = base;
  j["time_limit_s"] = -1;
  refused(j, "rl.time_limit_s");
  j = base;
  j["log_samples"] = -1;
  refused(j, "rl.log_samples");
  for (double share : {-0.1, 1.5}) {
    j = base;
    j["warm_start"]["direct_share"] = share;
    refused(j, "warm_start.direct_share");
  }
  j = base;
  j["warm_start"]["direct_share"] = 0.25;
  auto direct = parse_with(j);
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_EQ(direct->warm_start_direct_share, 0.25);
  EXPECT_EQ(plain->warm_start_direct_share, 0);
  // Routing replay runs on either device (moe_route_replay has a CUDA twin).
  for (const char* mode : {"measure", "on"}) {
    j = base;
    j["device"] = "cuda";
    j["routing_replay"] = mode;
    auto gpu_replay = parse_with(j);
    ASSERT_TRUE(gpu_replay.ok()) << gpu_replay.status();
    EXPECT_NE(gpu_replay->routing_replay, RoutingReplayMode::kOff);
  }
}

TEST(RlDeviceConfig, Bf16EngineRunOnTheCpuStopsAtItsTimeLimit) {
  const fs::path out = fs::path(LOOM_TEST_TMPDIR) / "rl_device_config_bf16";
  fs::remove_all(out);
  json j = tiny_run(out.string());
  j["engine"] = {{"weight_dtype", "bf16"}};
  j["time_limit_s"] = 1e-9;  // passed before the second step: one step runs
  j["log_samples"] = 3;
  auto config = parse_with(j);
  ASSERT_TRUE(config.ok()) << config.status();
  auto summary = run_rl(*config, nullptr);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->steps, 1);
  EXPECT_TRUE(summary->stopped_by_time_limit);
  EXPECT_GE(summary->initial_sync_s, 0);
  int steps = 0;
  std::ifstream metrics(out / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const json m = json::parse(line);
    if (!m.contains("step")) continue;
    ++steps;
    EXPECT_EQ(m["weight_version"], 1);  // the first sync's: the starting weights
  }
  EXPECT_EQ(steps, 1);
  // log_samples: 3 conversations of the step, one per group in turn (2 groups: 0, 1, 0), each the
  // chat-formatted text of its tokens with the environment's question and the model's turn.
  std::ifstream samples(out / "samples.jsonl");
  std::vector<int> sample_groups;
  for (std::string line; std::getline(samples, line);) {
    const json m = json::parse(line);
    EXPECT_EQ(m["step"], 1);
    sample_groups.push_back(m["group"].get<int>());
    const std::string text = m["text"].get<std::string>();
    EXPECT_NE(text.find("What is "), std::string::npos) << text;
    EXPECT_NE(text.find("<|start|>assistant"), std::string::npos) << text;
    for (const char* key :
         {"task_seed", "reward", "advantage", "answered", "malformed", "truncated"})
      EXPECT_TRUE(m.contains(key)) << key;
  }
  EXPECT_EQ(sample_groups, (std::vector<int>{0, 1, 0}));
  auto loaded = Model::load(summary->last_checkpoint, Placement{});
  EXPECT_TRUE(loaded.ok()) << loaded.status();
}

#ifndef LOOM_WITH_CUDA
TEST(RlDeviceConfig, AGpuRunWithoutTheCudaBackendIsRefused) {
  json j = tiny_run((fs::path(LOOM_TEST_TMPDIR) / "rl_device_config_cuda").string());
  j["device"] = "cuda";
  auto config = parse_with(j);
  ASSERT_TRUE(config.ok()) << config.status();
  auto summary = run_rl(*config, nullptr);
  EXPECT_EQ(summary.status().code(), absl::StatusCode::kInvalidArgument) << summary.status();
}
#endif

}  // namespace
}  // namespace loom
