// The roofline's byte counts against the parameter arena (the oracle: what was actually loaded),
// and the expected-experts formula at its limits.
#include "bench/offline/roofline.h"

#include <string>

#include "engine/model/cache_store.h"
#include "gtest/gtest.h"

namespace loom::bench {
namespace {

const std::string kFixtures = LOOM_FIXTURES_DIR;

TEST(Roofline, FootprintAddsUpToTheArena) {
  for (const char* fixture :
       {"kimi_linear_s1", "qwen3_next_s0", "deepseek_v3_s1", "fla_kda_s0", "kimi_linear_b0"}) {
    auto model = Model::load(kFixtures + "/" + fixture, Placement{.dtype = WeightDType::kAuto});
    ASSERT_TRUE(model.ok()) << model.status();
    const ModelFootprint f = model_footprint(**model, DType::kF32);
    const Tensor* embed = (*model)->parameters().find("embed.weight");
    ASSERT_NE(embed, nullptr);
    // Every byte loaded is the dense part, one expert's share times the experts, or the table.
    EXPECT_EQ(f.dense_bytes + f.num_experts * f.expert_bytes_all_layers +
                  static_cast<int64_t>(embed->nbytes()),
              static_cast<int64_t>((*model)->parameters().bytes()))
        << fixture;
    // One sequence, nothing cached: the dense part, top_k experts a layer, the state read and
    // written.
    EXPECT_DOUBLE_EQ(decode_step_bytes(f, 1, 0),
                     static_cast<double>(f.dense_bytes) +
                         static_cast<double>(f.top_k * f.expert_bytes_all_layers) +
                         2.0 * static_cast<double>(CacheStore::slot_bytes((*model)->config())))
        << fixture;
    EXPECT_GT(f.active_params, 0) << fixture;
  }
}

TEST(Roofline, ExpectedExpertsTouched) {
  EXPECT_DOUBLE_EQ(expected_experts_touched(256, 8, 1), 8.0);
  EXPECT_NEAR(expected_experts_touched(256, 8, 100000), 256.0, 1e-9);
  EXPECT_LT(expected_experts_touched(256, 8, 64), 256.0);
  EXPECT_GT(expected_experts_touched(256, 8, 64), expected_experts_touched(256, 8, 8));
  EXPECT_EQ(expected_experts_touched(0, 0, 5), 0.0);
}

}  // namespace
}  // namespace loom::bench
