// config.json parsing: the kimi_linear fixtures, and malformed configs rejected with messages that
// name the field at fault.
#include "weights/model_config.h"

#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace loom {
namespace {

std::string fixture_config(const std::string& name) {
  std::ifstream in(std::string(LOOM_FIXTURES_DIR) + "/" + name + "/config.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(ModelConfig, KimiLinearS0) {
  absl::StatusOr<ModelConfig> c = parse_model_config(fixture_config("kimi_linear_s0"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_layers, 4);
  EXPECT_EQ(c->hidden_size, 128);
  ASSERT_EQ(c->mixers.size(), 4u);
  EXPECT_EQ(c->mixers[0], MixerType::kKda);
  EXPECT_EQ(c->mixers[3], MixerType::kMla);
  EXPECT_EQ(c->ffns[0], FfnType::kDense);
  EXPECT_EQ(c->ffns[1], FfnType::kMoe);
  EXPECT_EQ(c->linear.num_heads, 2);
  EXPECT_EQ(c->linear.head_dim, 32);
  EXPECT_EQ(c->mla.q_lora_rank, 0);
  EXPECT_EQ(c->moe.num_experts, 8);
  EXPECT_EQ(c->moe.top_k, 2);
  EXPECT_EQ(c->moe.shared_intermediate_size, 64);
  EXPECT_FLOAT_EQ(c->moe.routed_scaling, 2.446f);
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-5f);
}

TEST(ModelConfig, KimiLinearS1OneIndexedLayers) {
  absl::StatusOr<ModelConfig> c = parse_model_config(fixture_config("kimi_linear_s1"));
  ASSERT_TRUE(c.ok()) << c.status();
  // full_attn_layers = [3] (1-indexed) is layer 2.
  ASSERT_EQ(c->mixers.size(), 5u);
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(c->mixers[i], i == 2 ? MixerType::kMla : MixerType::kKda) << i;
  EXPECT_EQ(c->moe.n_group, 2);
  EXPECT_EQ(c->moe.topk_group, 1);
  EXPECT_EQ(c->mla.q_lora_rank, 40);
}

TEST(ModelConfig, LayerListsWithoutLayerTypes) {
  nlohmann::json j = nlohmann::json::parse(fixture_config("kimi_linear_s1"));
  j.erase("layer_types");
  absl::StatusOr<ModelConfig> c = parse_model_config(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->mixers[2], MixerType::kMla);
  EXPECT_EQ(c->mixers[4], MixerType::kKda);
}

struct BadCase {
  std::string what;
  std::function<void(nlohmann::json&)> edit;
  std::string expect;  // substring of the error message
};

TEST(ModelConfig, RejectsMalformed) {
  const nlohmann::json base = nlohmann::json::parse(fixture_config("kimi_linear_s1"));
  const std::vector<BadCase> cases = {
      {"unknown family", [](auto& j) { j["model_type"] = "llama9"; }, "unsupported model_type"},
      {"no family", [](auto& j) { j.erase("model_type"); }, "model_type"},
      {"hidden as string", [](auto& j) { j["hidden_size"] = "96"; }, "hidden_size"},
      {"negative hidden", [](auto& j) { j["hidden_size"] = -4; }, "hidden_size"},
      {"layer both kda and full",
       [](auto& j) {
         j.erase("layer_types");
         j["linear_attn_config"]["kda_layers"] = {1, 2, 3, 4, 5};
       },
       "listed twice"},
      {"0-indexed list",
       [](auto& j) {
         j.erase("layer_types");
         j["linear_attn_config"]["full_attn_layers"] = {0};
         j["linear_attn_config"]["kda_layers"] = {1, 2, 3, 4};
       },
       "1-indexed"},
      {"layer_types contradicts lists", [](auto& j) { j["layer_types"][0] = "full_attention"; },
       "contradicts"},
      {"bad layer type", [](auto& j) { j["layer_types"][1] = "mamba"; }, "layer_types[1]"},
      {"short mlp list", [](auto& j) { j["mlp_layer_types"] = {"dense"}; }, "mlp_layer_types"},
      {"top-k > experts", [](auto& j) { j["num_experts_per_token"] = 40; }, "num_experts"},
      {"groups not dividing", [](auto& j) { j["num_expert_group"] = 5; }, "n_group"},
      {"topk_group > groups", [](auto& j) { j["topk_group"] = 3; }, "topk_group"},
      {"activation", [](auto& j) { j["hidden_act"] = "gelu"; }, "hidden_act"},
      {"kv heads", [](auto& j) { j["num_key_value_heads"] = 2; }, "num_key_value_heads"},
      {"conv kernel", [](auto& j) { j["linear_attn_config"]["short_conv_kernel_size"] = 0; },
       "kernel"},
      {"huge layer count", [](auto& j) { j["num_hidden_layers"] = 100000; }, "num_hidden_layers"},
      {"eps", [](auto& j) { j["rms_norm_eps"] = 0; }, "rms_norm_eps"},
  };
  for (const BadCase& bc : cases) {
    nlohmann::json j = base;
    bc.edit(j);
    absl::StatusOr<ModelConfig> c = parse_model_config(j.dump());
    ASSERT_FALSE(c.ok()) << bc.what;
    EXPECT_NE(std::string(c.status().message()).find(bc.expect), std::string::npos)
        << bc.what << ": " << c.status();
  }
  EXPECT_FALSE(parse_model_config("{not json").ok());
  EXPECT_FALSE(parse_model_config("[1, 2]").ok());
  EXPECT_FALSE(parse_model_config(std::string(5 << 20, ' ')).ok());
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// Every family's fixture config parses; family-specific bad values are rejected by name.
TEST(ModelConfig, OtherFamilies) {
  struct Case {
    const char* fixture;
    std::function<void(nlohmann::json&)> edit;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"deepseek_v3_s1", [](auto& j) { j["rope_parameters"]["rope_type"] = "dynamic"; }, "dynamic"},
      {"deepseek_v3_s1", [](auto& j) { j["scoring_func"] = "softmax"; }, "scoring_func"},
      {"deepseek_v3_s1", [](auto& j) { j["rope_parameters"].erase("factor"); }, "factor"},
      {"deepseek_v3_s1", [](auto& j) { j["n_group"] = 3; }, "n_group"},
      {"qwen3_next_s0", [](auto& j) { j["layer_types"][2] = "sliding_attention"; },
       "layer_types[2]"},
      {"qwen3_next_s0", [](auto& j) { j["linear_num_value_heads"] = 3; }, "multiple"},
      {"qwen3_next_s0", [](auto& j) { j["mlp_only_layers"] = {9}; }, "mlp_only_layers"},
      {"qwen3_next_s0",
       [](auto& j) {
         j["partial_rotary_factor"] = 1.5;
         j["rope_parameters"].erase("partial_rotary_factor");
       },
       "partial_rotary_factor"},
      {"fla_kda_s0", [](auto& j) { j["attn"]["layers"] = {7}; }, "attn.layers"},
      {"fla_kda_s0", [](auto& j) { j["lower_bound"] = 2.0; }, "lower_bound"},
      {"fla_kda_s0", [](auto& j) { j["allow_neg_eigval"] = true; }, "allow_neg_eigval"},
      {"fla_kda_s0", [](auto& j) { j["attn"]["window_size"] = 128; }, "window_size"},
      {"fla_kda_s0", [](auto& j) { j["attnres_block_size"] = -1; }, "attnres_block_size"},
  };
  for (const char* f : {"deepseek_v3_s1", "qwen3_next_s0", "fla_kda_s0"}) {
    absl::StatusOr<ModelConfig> c = parse_model_config(fixture_config(f));
    EXPECT_TRUE(c.ok()) << f << ": " << c.status();
  }
  for (const Case& bc : cases) {
    nlohmann::json j = nlohmann::json::parse(fixture_config(bc.fixture));
    bc.edit(j);
    absl::StatusOr<ModelConfig> c = parse_model_config(j.dump());
    ASSERT_FALSE(c.ok()) << bc.fixture << " " << bc.expect;
    EXPECT_NE(std::string(c.status().message()).find(bc.expect), std::string::npos)
        << bc.fixture << ": " << c.status();
  }
  // Derived values the adapters must get right.
  ModelConfig q = *parse_model_config(fixture_config("qwen3_next_s0"));
  EXPECT_EQ(q.norm_weight_offset, 1.0f);
  EXPECT_EQ(q.mixers[3], MixerType::kGqa);
  EXPECT_EQ(q.linear.num_v_heads, 4);
  EXPECT_TRUE(q.moe.shared_expert_gate);
  ModelConfig d = *parse_model_config(fixture_config("deepseek_v3_s1"));
  EXPECT_EQ(d.rope.type, RopeConfig::Type::kYarn);
  EXPECT_TRUE(d.rope.interleaved);
  EXPECT_EQ(d.ffns[0], FfnType::kDense);
  ModelConfig k = *parse_model_config(fixture_config("fla_kda_s0"));
  EXPECT_EQ(k.linear.gate_lower_bound, -5.0f);
  EXPECT_EQ(k.attnres_block_size, 4);
  EXPECT_EQ(k.mixers[3], MixerType::kGqa);
  EXPECT_EQ(k.gqa.head_dim, 32);
}

}  // namespace
}  // namespace loom
