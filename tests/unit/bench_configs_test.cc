// The production-shaped configs of bench/configs (run with --random_weights): each parses, its
// layout (built by Model::load, nothing filled: address space only) holds exactly the parameters
// counted here independently from the config.json fields, and the counts and bf16 bytes are the
// published models' and fit one H200 with room for a cache.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <string>

#include "engine/model/model.h"
#include "engine/model/random_weights.h"
#include "nlohmann/json.hpp"

namespace loom {
namespace {

const std::string kConfigs = std::string(LOOM_SOURCE_DIR) + "/bench/configs";
constexpr double kH200Bytes = 139.0 * (1ull << 30);  // what the device shows
// Kept free beside the weights: the 48B model's 1M-token latent cache (7 MLA layers x 576 bf16
// values a token, about 8 GB) plus step workspaces and the CUDA context.
constexpr double kRoomBytes = 12.0 * (1ull << 30);

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return nlohmann::json::parse(in);
}

// Parameters and bf16-placement bytes, by hand from the fields.
struct Count {
  double total = 0, experts = 0, embed = 0, bytes = 0;
  double active(double top_k, double num_experts) const {
    return total - embed - experts * (1.0 - top_k / num_experts);  // the lookup table is no GEMM
  }
};

// Adds a tensor of n values: bf16 GEMM matrix or f32 (weights/parameter_arena.h's rule).
void add(Count& c, double n, bool matrix) {
  c.total += n;
  c.bytes += n * (matrix ? 2 : 4);
}

Count kimi_linear_count(const nlohmann::json& j) {
  Count c;
  const double d = j["hidden_size"], v = j["vocab_size"], e = j["num_experts"],
               i = j["moe_intermediate_size"], h = j["num_attention_heads"];
  const nlohmann::json& lac = j["linear_attn_config"];
  const double hk = lac["num_heads"], dk = lac["head_dim"], w = lac["short_conv_kernel_size"];
  const double nope = j["qk_nope_head_dim"], rope = j["qk_rope_head_dim"], vd = j["v_head_dim"],
               r = j["kv_lora_rank"];
  const std::set<int> kda = lac["kda_layers"].get<std::set<int>>();
  const int dense = j["first_k_dense_replace"];
  add(c, v * d, false);  // embedding
  c.embed = v * d;
  add(c, v * d, true);  // lm_head
  add(c, d, false);     // final norm
  for (int l = 1; l <= j["num_hidden_layers"].get<int>(); ++l) {
    add(c, 2 * d, false);  // the two pre-norms
    if (kda.count(l)) {
      const double ck = hk * dk;
      add(c, 3 * ck * d + dk * d + ck * dk + hk * d + dk * d + ck * dk + d * ck, true);
      add(c, 3 * ck * w + ck + hk + dk, false);  // conv, dt_bias, A_log, o_norm
    } else {
      add(c, h * (nope + rope) * d + (r + rope) * d + d * h * vd, true);
      add(c, r + h * (nope + vd) * r, false);  // kv_a_norm, kv_b_proj (f32)
    }
    if (l <= dense) {
      add(c, 3 * d * j["intermediate_size"].get<double>(), true);
    } else {
      add(c, e * d + e, false);  // router and its score bias
      add(c, 3 * d * i * j["num_shared_experts"].get<double>(), true);
      add(c, 3 * e * i * d, true);
      c.experts += 3 * e * i * d;
    }
  }
  return c;
}

Count qwen3_next_count(const nlohmann::json& j, int layers) {
  Count c;
  const double d = j["hidden_size"], v = j["vocab_size"], e = j["num_experts"],
               i = j["moe_intermediate_size"], si = j["shared_expert_intermediate_size"];
  const double hk = j["linear_num_key_heads"], hv = j["linear_num_value_heads"],
               dk = j["linear_key_head_dim"], dv = j["linear_value_head_dim"],
               w = j["linear_conv_kernel_dim"];
  const double h = j["num_attention_heads"], kvh = j["num_key_value_heads"], hd = j["head_dim"];
  const int interval = j["full_attention_interval"];
  add(c, v * d, false);
  c.embed = v * d;
  add(c, v * d, true);
  add(c, d, false);
  for (int l = 0; l < layers; ++l) {
    add(c, 2 * d, false);
    if ((l + 1) % interval != 0) {
      const double ck = hk * dk, cv = hv * dv;
      add(c, (2 * ck + 2 * cv) * d + 2 * hv * d + d * cv, true);  // qkvz, ba, out
      add(c, (2 * ck + cv) * w + 2 * hv + dv, false);             // conv, A_log, dt_bias, norm
    } else {
      add(c, 2 * h * hd * d + 2 * kvh * hd * d + d * h * hd, true);  // q (+gate), k, v, o
      add(c, 2 * hd, false);                                         // q/k norms
    }
    add(c, e * d + d, false);  // router, shared-expert gate
    add(c, 3 * d * si, true);
    add(c, 3 * e * i * d, true);
    c.experts += 3 * e * i * d;
  }
  return c;
}

// The parameters of the config's layout, as Model::load builds them (a bf16 placement; the
// generator fills nothing, so the host arena's pages are never touched).
struct Built {
  double total = 0, experts = 0, bytes = 0;
  ModelConfig cfg;
};
Built build_layout(const std::string& path) {
  Built b;
  absl::StatusOr<ModelConfig> cfg = load_random_weights_config(path);
  EXPECT_TRUE(cfg.ok()) << cfg.status();
  if (!cfg.ok()) return b;
  b.cfg = *cfg;
  const WeightLoader untouched = WeightLoader::generated(
      *cfg,
      [](std::string_view, const Shape&, ExpertRange, const Tensor&) { return absl::OkStatus(); });
  auto m = Model::load(*cfg, untouched, Placement{.dtype = WeightDType::kBF16});
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return b;
  for (const auto& e : (*m)->parameters().entries()) {
    b.total += static_cast<double>(e.tensor.numel());
    if (e.name.find(".moe.experts.") != std::string::npos)
      b.experts += static_cast<double>(e.tensor.numel());
  }
  b.bytes = static_cast<double>((*m)->parameters().bytes());
  return b;
}

TEST(BenchConfigs, KimiLinear48bA3b) {
  const std::string path = kConfigs + "/kimi_linear_48b_a3b/config.json";
  const nlohmann::json j = read_json(path);
  const Count want = kimi_linear_count(j);
  const Built got = build_layout(path);
  EXPECT_EQ(got.cfg.model_type, "kimi_linear");
  int kda = 0, mla = 0;
  for (MixerType m : got.cfg.mixers) (m == MixerType::kKda ? kda : mla) += 1;
  EXPECT_EQ(kda, 20);
  EXPECT_EQ(mla, 7);
  EXPECT_EQ(got.cfg.hidden_size, 2304);
  EXPECT_EQ(got.cfg.vocab_size, 163840);
  EXPECT_EQ(got.cfg.moe.num_experts, 256);
  EXPECT_EQ(got.cfg.moe.top_k, 8);
  EXPECT_EQ(got.cfg.moe.intermediate_size, 1024);
  EXPECT_EQ(got.cfg.linear.num_heads * got.cfg.linear.head_dim, 32 * 128);
  EXPECT_EQ(got.total, want.total);
  EXPECT_EQ(got.experts, want.experts);
  EXPECT_EQ(got.bytes, want.bytes);
  const double active = want.active(8, 256);
  std::printf(
      "kimi_linear_48b_a3b: %.3fB parameters, %.3fB active (without the embedding), "
      "%.2f GB in bf16\n",
      want.total / 1e9, active / 1e9, want.bytes / 1e9);
  EXPECT_NEAR(want.total / 48e9, 1.0, 0.03);  // "48B"
  EXPECT_NEAR(active / 3e9, 1.0, 0.1);        // "A3B"
  EXPECT_NEAR(want.bytes / 96e9, 1.0, 0.05);  // "about 96 GB in bf16"
  EXPECT_LE(want.bytes + kRoomBytes, kH200Bytes);
}

TEST(BenchConfigs, Qwen3Next80bA3bCutToFit) {
  const std::string path = kConfigs + "/qwen3_next_80b_a3b/config.json";
  const nlohmann::json j = read_json(path);
  const int layers = j["num_hidden_layers"];
  const Count want = qwen3_next_count(j, layers);
  const Built got = build_layout(path);
  EXPECT_EQ(got.cfg.model_type, "qwen3_next");
  EXPECT_EQ(got.total, want.total);
  EXPECT_EQ(got.experts, want.experts);
  EXPECT_EQ(got.bytes, want.bytes);
  // The published shape: 48 layers are 80B with about 3B active (embedding excluded).
  const Count published = qwen3_next_count(j, 48);
  EXPECT_NEAR(published.total / 80e9, 1.0, 0.03);
  // 3.56B counting lm_head: Qwen's "A3B" rounds down further than Kimi's (3.1B).
  EXPECT_NEAR(published.active(10, 512) / 3e9, 1.0, 0.2);
  EXPECT_GT(published.bytes + kRoomBytes, kH200Bytes);  // which is why layers were cut
  // As many whole (3 linear + 1 full attention) blocks as fit with the room kept.
  EXPECT_EQ(layers % 4, 0);
  EXPECT_LE(want.bytes + kRoomBytes, kH200Bytes);
  EXPECT_GT(qwen3_next_count(j, layers + 4).bytes + kRoomBytes, kH200Bytes);
  std::printf(
      "qwen3_next_80b_a3b: %d of 48 layers, %.3fB parameters (%.3fB published), %.3fB "
      "active, %.2f GB in bf16\n",
      layers, want.total / 1e9, published.total / 1e9, want.active(10, 512) / 1e9,
      want.bytes / 1e9);
}

}  // namespace
}  // namespace loom
