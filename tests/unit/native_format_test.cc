// The native format: conversion from every family gives the same logits as the original, a random
// native checkpoint survives write -> load unchanged, and broken checkpoints are rejected with
// messages that name the tensor.
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "engine/model/model.h"
#include "engine/model/native_export.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "weights/adapters/adapters.h"
#include "weights/safetensors.h"

namespace loom {
namespace {

const std::string kFixtures = LOOM_FIXTURES_DIR;
const std::string kTmp = LOOM_TEST_TMPDIR;

// Prefill of `len` random tokens (all logits) then `decode` single-token steps; returns every
// logit row produced, concatenated.
std::vector<float> run(const Model& m, int len, int decode, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> tok(0, m.config().vocab_size - 1);
  SequenceCache cache = m.new_cache();
  ForwardBatch b;
  for (int i = 0; i < len; ++i) b.token_ids.push_back(tok(rng));
  b.seqs.push_back({.num_tokens = len, .logits = LogitsMode::kAll, .cache = &cache});
  std::vector<float> out;
  for (int step = 0; step <= decode; ++step) {
    absl::StatusOr<Tensor> l = m.forward(b);
    EXPECT_TRUE(l.ok()) << l.status();
    if (!l.ok()) return out;
    out.insert(out.end(), l->data<float>(), l->data<float>() + l->numel());
    b.token_ids = {tok(rng)};
    b.seqs[0].num_tokens = 1;
  }
  return out;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    m = std::max(m, static_cast<double>(std::abs(a[i] - b[i])));
  return m;
}

class ConvertFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(ConvertFixture, SameLogitsAsOriginal) {
  const std::string src = kFixtures + "/" + GetParam();
  const std::string dst = kTmp + "/native_" + GetParam();
  ASSERT_TRUE(convert_to_native(src, dst).ok());
  auto a = Model::load(src);
  auto b = Model::load(dst);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->config().model_type, "loom");
  // Same f32 weights, same kernels: the logits must be bitwise identical.
  EXPECT_EQ(max_abs_diff(run(**a, 77, 3, 1), run(**b, 77, 3, 1)), 0.0);

  // bf16 storage: every stored value is the round-to-nearest-even bf16 of the f32 weight. (The
  // logits then move a lot on these tiny random MoE models: a 2^-9 weight perturbation upstream of
  // a router flips near-tied expert choices; measured relative L2 0.07 to 0.5 across the fixtures,
  // so no tight logit bound is asserted here.)
  const std::string dst16 = dst + "_bf16";
  ExportOptions bf16;
  bf16.bf16 = true;
  ASSERT_TRUE(convert_to_native(src, dst16, bf16).ok());
  auto f32_file = SafetensorsFile::open(dst + "/model.safetensors");
  auto bf16_file = SafetensorsFile::open(dst16 + "/model.safetensors");
  ASSERT_TRUE(f32_file.ok() && bf16_file.ok());
  EXPECT_EQ((*f32_file)->names(), (*bf16_file)->names());
  for (const std::string& name : (*f32_file)->names()) {
    Tensor x = *(*f32_file)->get(name), y = *(*bf16_file)->get(name);
    ASSERT_EQ(y.dtype(), DType::kBF16) << name;
    ASSERT_EQ(x.shape(), y.shape()) << name;
    for (int64_t i = 0; i < x.numel(); ++i)
      ASSERT_EQ(y.data<uint16_t>()[i], f32_to_bf16(x.data<float>()[i])) << name << " " << i;
  }
  auto c = Model::load(dst16);
  ASSERT_TRUE(c.ok()) << c.status();
  for (float v : run(**c, 40, 0, 2)) ASSERT_TRUE(std::isfinite(v));
}

INSTANTIATE_TEST_SUITE_P(Families, ConvertFixture,
                         ::testing::Values("kimi_linear_s0", "kimi_linear_s1", "deepseek_v3_s1",
                                           "qwen3_next_s0", "fla_kda_s0"));

// A native config using every feature: all four mixers, dense and MoE FFNs, grouped sigmoid routing
// with a gated shared expert, gated MLA with YaRN RoPE, gated GQA with q/k norm, AttnRes.
ModelConfig everything_config() {
  nlohmann::json j = {
      {"model_type", "loom"},
      {"vocab_size", 97},
      {"hidden_size", 48},
      {"num_hidden_layers", 5},
      {"intermediate_size", 40},
      {"rms_norm_eps", 1e-6},
      {"attnres_block_size", 3},
      {"layer_types", {"kda", "gdn", "mla", "gqa", "kda"}},
      {"mlp_layer_types", {"dense", "moe", "moe", "dense", "moe"}},
      {"linear_attention",
       {{"num_heads", 2},
        {"num_v_heads", 4},
        {"head_dim", 12},
        {"v_head_dim", 10},
        {"conv_kernel", 4},
        {"gate_rank", 8},
        {"gate_lower_bound", -5.0},
        {"output_gate_bias", true}}},
      {"mla",
       {{"num_heads", 3},
        {"q_lora_rank", 20},
        {"kv_lora_rank", 24},
        {"qk_nope_head_dim", 10},
        {"qk_rope_head_dim", 6},
        {"v_head_dim", 9},
        {"output_gate", true}}},
      {"gqa",
       {{"num_heads", 4},
        {"num_kv_heads", 2},
        {"head_dim", 12},
        {"qk_norm", true},
        {"output_gate", true}}},
      {"rope",
       {{"type", "yarn"},
        {"rope_theta", 10000.0},
        {"factor", 4.0},
        {"original_max_position_embeddings", 64},
        {"mscale", 1.0},
        {"mscale_all_dim", 1.0},
        {"interleaved", true}}},
      {"moe",
       {{"num_experts", 8},
        {"top_k", 3},
        {"intermediate_size", 16},
        {"num_shared_experts", 1},
        {"shared_expert_gate", true},
        {"score", "sigmoid"},
        {"n_group", 4},
        {"topk_group", 2},
        {"routed_scaling", 2.0}}},
      {"balance", {{"q_low", 0.2}, {"q_high", 0.8}, {"eta", 0.001}}},
  };
  absl::StatusOr<ModelConfig> c = parse_model_config(j.dump());
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

TEST(NativeFormat, ConfigRoundTrip) {
  const ModelConfig c = everything_config();
  const nlohmann::json once = native_config_json(c);
  absl::StatusOr<ModelConfig> again = parse_model_config(once.dump());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(native_config_json(*again), once);
}

TEST(NativeFormat, RandomCheckpointRoundTrip) {
  const ModelConfig cfg = everything_config();
  WeightLoader synthetic = WeightLoader::synthetic(cfg, 7);
  WeightLoader::Record record;
  synthetic.set_recorder(&record);
  auto a = Model::load(cfg, synthetic);
  ASSERT_TRUE(a.ok()) << a.status();
  const std::string dir = kTmp + "/native_roundtrip";
  ASSERT_TRUE(write_native_checkpoint(cfg, record, dir).ok());
  auto b = Model::load(dir);
  ASSERT_TRUE(b.ok()) << b.status();
  const std::vector<float> la = run(**a, 70, 4, 3);
  EXPECT_EQ(max_abs_diff(la, run(**b, 70, 4, 3)), 0.0);
  for (float v : la) ASSERT_TRUE(std::isfinite(v));
}

// Writes the random native checkpoint with one tensor changed by `edit`, returns the load error.
std::string load_error_after(const std::string& name,
                             const std::function<void(WeightLoader::Record&)>& edit) {
  const ModelConfig cfg = everything_config();
  WeightLoader synthetic = WeightLoader::synthetic(cfg, 7);
  WeightLoader::Record record;
  synthetic.set_recorder(&record);
  EXPECT_TRUE(Model::load(cfg, synthetic).ok());
  edit(record);
  const std::string dir = kTmp + "/native_broken_" + name;
  EXPECT_TRUE(write_native_checkpoint(cfg, record, dir).ok());
  auto m = Model::load(dir);
  EXPECT_FALSE(m.ok());
  return m.ok() ? "" : std::string(m.status().message());
}

TEST(NativeFormat, MissingTensorIsNamed) {
  const std::string err = load_error_after("missing", [](WeightLoader::Record& r) {
    std::erase_if(r, [](const auto& e) { return e.first == "layers.2.mla.kv_b_proj.weight"; });
  });
  EXPECT_NE(err.find("layers.2.mla.kv_b_proj.weight"), std::string::npos) << err;
}

TEST(NativeFormat, MisShapedTensorIsNamed) {
  const std::string err = load_error_after("shape", [](WeightLoader::Record& r) {
    for (auto& [n, t] : r)
      if (n == "layers.1.gdn.ba_proj.weight") t = Tensor::zeros({5, 48});
  });
  EXPECT_NE(err.find("layers.1.gdn.ba_proj.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("[5, 48]"), std::string::npos) << err;
}

TEST(NativeFormat, RejectsBadConfigs) {
  nlohmann::json j = native_config_json(everything_config());
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> edit;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"unknown mixer", [](auto& c) { c["layer_types"][0] = "mamba"; }, "layer_types[0]"},
      {"short list", [](auto& c) { c["mlp_layer_types"] = {"dense"}; }, "mlp_layer_types"},
      {"bad score", [](auto& c) { c["moe"]["score"] = "relu"; }, "moe.score"},
      {"bad rope", [](auto& c) { c["rope"]["type"] = "longrope"; }, "longrope"},
      {"norm offset", [](auto& c) { c["rms_norm_weight_offset"] = 0.5; }, "rms_norm_weight_offset"},
      {"balance", [](auto& c) { c["balance"]["q_low"] = 0.9; }, "balance"},
      {"positive bound", [](auto& c) { c["linear_attention"]["gate_lower_bound"] = 1.0; },
       "lower bound"},
      {"value heads", [](auto& c) { c["linear_attention"]["num_v_heads"] = 3; }, "multiple"},
  };
  for (const Case& c : cases) {
    nlohmann::json e = j;
    c.edit(e);
    absl::StatusOr<ModelConfig> r = parse_model_config(e.dump());
    ASSERT_FALSE(r.ok()) << c.what;
    EXPECT_NE(std::string(r.status().message()).find(c.expect), std::string::npos)
        << c.what << ": " << r.status();
  }
}

}  // namespace
}  // namespace loom
