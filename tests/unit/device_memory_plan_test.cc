// The derived cache budget (engine/device_memory_plan.h) off the GPU: the profiling step runs on
// any device and measures more step memory for a larger prefill; a derived budget on the host is
// refused with the reason, by the planner and by Engine::create.
// tests/gpu/model_cuda_test.cc checks a plan on the GPU.
#include "engine/device_memory_plan.h"

#include <string>

#include "engine/engine.h"
#include "gtest/gtest.h"

namespace loom {
namespace {

const std::string kFixtures = LOOM_FIXTURES_DIR;

TEST(DeviceMemoryPlan, ProfileGrowsWithTheStep) {
  for (const char* fixture : {"kimi_linear_s0", "qwen3_next_s0", "deepseek_v3_s1"}) {
    auto model = Model::load(kFixtures + "/" + fixture);
    ASSERT_TRUE(model.ok()) << model.status();
    auto small = profile_step_memory(**model, 16, 8, false);
    auto large = profile_step_memory(**model, 100, 8, false);
    auto invariant = profile_step_memory(**model, 100, 8, true);
    ASSERT_TRUE(small.ok()) << small.status();
    ASSERT_TRUE(large.ok()) << large.status();
    ASSERT_TRUE(invariant.ok()) << invariant.status();
    // Every row's activations at least: the hidden state of each token, in f32.
    EXPECT_GE(*small, 16 * (*model)->config().hidden_size * 4) << fixture;
    EXPECT_GT(*large, *small) << fixture;
    EXPECT_GT(*invariant, 0) << fixture;
    EXPECT_EQ(profile_step_memory(**model, 0, 8, false).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

// The profile runs with the engine's KV page dtype (unset: the activation dtype). A prefill from
// position 0 attends over its own new keys, so on the CPU fp8 pages leave its high-water as it
// was (measured: 664,832 bytes either way on deepseek_v3_s1 at 100 tokens).
TEST(DeviceMemoryPlan, ProfileUsesTheKvDtype) {
  auto model = Model::load(kFixtures + "/deepseek_v3_s1");
  ASSERT_TRUE(model.ok()) << model.status();
  auto plain = profile_step_memory(**model, 100, 8, false);
  auto same = profile_step_memory(**model, 100, 8, false, (*model)->act_dtype());
  auto fp8 = profile_step_memory(**model, 100, 8, false, DType::kF8E4M3);
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE(same.ok()) << same.status();
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  EXPECT_EQ(*same, *plain);
  EXPECT_EQ(*fp8, *plain);
}

TEST(DeviceMemoryPlan, RefusedOnTheHost) {
  auto model = Model::load(kFixtures + "/kimi_linear_s0");
  ASSERT_TRUE(model.ok()) << model.status();
  BatchSampler sampler(Device::kCpu);
  EngineOptions o;
  o.cache_budget_bytes = 0;
  EXPECT_EQ(plan_device_memory(**model, o, sampler).status().message(),
            "a cache budget of 0 (derive it from free device memory) needs a GPU: give the budget "
            "in bytes on the CPU (--cache_budget_mb)");
  auto engine = Engine::create(std::move(*model), nullptr, o);
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(engine.status().message().find("needs a GPU"), std::string::npos) << engine.status();
}

}  // namespace
}  // namespace loom
