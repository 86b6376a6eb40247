// The run configs committed as recipes (weights/default/train-*.json, the bundled default's;
// bench/trainer_gpu/mqar256/run.json, MQAR at 256) parse as the trainer reads them, and their
// model configs load: a recipe that drifted from the trainer's options would fail only on a GPU.
#include <fstream>
#include <sstream>
#include <string>

#include "engine/engine.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "trainer/run_config.h"

namespace loom {
namespace {

const std::string kSource = LOOM_SOURCE_DIR;

std::string text_of(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(TrainerRecipes, EveryCommittedRunConfigParses) {
  for (const char* recipe :
       {"weights/default/train-1-passkey.json", "weights/default/train-2-tools.json",
        "weights/default/train-3-tools.json", "bench/trainer_gpu/mqar256/run.json"}) {
    const std::string text = text_of(kSource + "/" + recipe);
    ASSERT_FALSE(text.empty()) << recipe;
    absl::StatusOr<RunConfig> c = parse_run_config(text);
    ASSERT_TRUE(c.ok()) << recipe << ": " << c.status();
    if (c->model_config.empty()) continue;  // from a checkpoint an earlier step writes
    absl::StatusOr<ModelConfig> m = parse_model_config(text_of(kSource + "/" + c->model_config));
    EXPECT_TRUE(m.ok()) << recipe << ": " << m.status();
  }
}

// The MQAR recipe's model is the bundled default's architecture with a rotary part in MLA, and its
// curriculum ends the packed stage on a loss target, not on the plateau before recall is learned.
TEST(TrainerRecipes, MqarRecipeIsTheDefaultWithRopeMla) {
  nlohmann::json mqar =
      nlohmann::json::parse(text_of(kSource + "/bench/trainer_gpu/mqar256/config.json"));
  nlohmann::json def = nlohmann::json::parse(text_of(kSource + "/weights/default/config.json"));
  EXPECT_EQ(mqar["mla"]["qk_rope_head_dim"], 32);
  EXPECT_EQ(def["mla"]["qk_rope_head_dim"], 0);
  mqar["mla"]["qk_rope_head_dim"] = 0;
  EXPECT_EQ(mqar, def);
  absl::StatusOr<RunConfig> c =
      parse_run_config(text_of(kSource + "/bench/trainer_gpu/mqar256/run.json"));
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
