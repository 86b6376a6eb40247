// The run configs committed as recipes (weights/default/train-*.json, the bundled default's;
// bench/trainer_gpu/mqar256/run.json, MQAR at 256) parse as the trainer reads them, and their
// model configs load: a recipe that drifted from the trainer's options would fail only on a GPU.
#include <filesystem>
#include <fstream>
#include <string>

#include "engine/engine.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "trainer/run_config.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

const std::string kSource = LOOM_SOURCE_DIR;

nlohmann::json json_at(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

TEST(TrainerRecipes, EveryCommittedRunConfigParses) {
  for (const char* recipe :
       {"weights/default/train-1-passkey.json", "weights/default/train-2-tools.json",
        "weights/default/train-3-tools.json", "bench/trainer_gpu/mqar256/run.json"}) {
    absl::StatusOr<RunConfig> c = load_run_config(kSource + "/" + recipe);
    ASSERT_TRUE(c.ok()) << recipe << ": " << c.status();
    if (c->model_config.empty()) continue;  // from a checkpoint an earlier step writes
    absl::StatusOr<ModelConfig> m =
        load_model_config(fs::path(kSource + "/" + c->model_config).parent_path().string());
    EXPECT_TRUE(m.ok()) << recipe << ": " << m.status();
  }
}

// The MQAR recipe's model is the bundled default's architecture with a rotary part in MLA, and its
// curriculum ends the packed stage on a loss target, not on the plateau before recall is learned.
TEST(TrainerRecipes, MqarRecipeIsTheDefaultWithRopeMla) {
  nlohmann::json mqar = json_at(kSource + "/bench/trainer_gpu/mqar256/config.json");
  const nlohmann::json def = json_at(kSource + "/weights/default/config.json");
  EXPECT_EQ(mqar["mla"]["qk_rope_head_dim"], 32);
  EXPECT_EQ(def["mla"]["qk_rope_head_dim"], 0);
  mqar["mla"]["qk_rope_head_dim"] = 0;
  EXPECT_EQ(mqar, def);
  absl::StatusOr<RunConfig> c = load_run_config(kSource + "/bench/trainer_gpu/mqar256/run.json");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->stages.size(), 2u);
  EXPECT_EQ(c->stages[0].seq_len, 64);
  EXPECT_FALSE(c->stages[0].mqar.spread);
  EXPECT_GT(c->stages[0].target_loss, 0);
  EXPECT_EQ(c->stages[1].seq_len, 256);
  EXPECT_TRUE(c->stages[1].mqar.spread);
  EXPECT_EQ(c->stages[1].mqar.num_pairs, 16);
}

}  // namespace
}  // namespace loom
