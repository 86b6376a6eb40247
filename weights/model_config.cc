#include "weights/model_config.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "nlohmann/json.hpp"
#include "weights/adapters/adapters.h"

namespace loom {

std::string_view mixer_type_name(MixerType t) {
  switch (t) {
    case MixerType::kKda:
      return "kda";
    case MixerType::kGdn:
      return "gdn";
    case MixerType::kMla:
      return "mla";
    case MixerType::kGqa:
      return "gqa";
  }
  return "?";
}

namespace {
absl::Status positive(int v, const char* field) {
  if (v <= 0) return absl::InvalidArgumentError(absl::StrCat(field, " must be > 0, got ", v));
  return absl::OkStatus();
}
}  // namespace

absl::Status ModelConfig::validate() const {
  LOOM_RETURN_IF_ERROR(positive(vocab_size, "vocab_size"));
  LOOM_RETURN_IF_ERROR(positive(hidden_size, "hidden_size"));
  LOOM_RETURN_IF_ERROR(positive(num_layers, "num_hidden_layers"));
  if (num_layers > 4096) return absl::InvalidArgumentError("num_hidden_layers above 4096");
  if (static_cast<int>(mixers.size()) != num_layers || static_cast<int>(ffns.size()) != num_layers)
    return absl::InvalidArgumentError(
        absl::StrCat("layer type lists have ", mixers.size(), " mixer and ", ffns.size(),
                     " FFN entries; expected num_hidden_layers = ", num_layers));
  if (!(rms_norm_eps > 0.0f) || rms_norm_eps > 1.0f)
    return absl::InvalidArgumentError(absl::StrCat("rms_norm_eps out of range: ", rms_norm_eps));
  bool any_kda = false, any_mla = false, any_moe = false, any_dense = false;
  for (MixerType m : mixers) {
    any_kda |= m == MixerType::kKda || m == MixerType::kGdn;
    any_mla |= m == MixerType::kMla;
  }
  for (FfnType f : ffns) {
    any_moe |= f == FfnType::kMoe;
    any_dense |= f == FfnType::kDense;
  }
  if (any_kda) {
    LOOM_RETURN_IF_ERROR(positive(linear.num_heads, "linear attention num_heads"));
    LOOM_RETURN_IF_ERROR(positive(linear.head_dim, "linear attention head_dim"));
    LOOM_RETURN_IF_ERROR(positive(linear.v_head_dim, "linear attention v_head_dim"));
    LOOM_RETURN_IF_ERROR(positive(linear.num_v_heads, "linear attention num_v_heads"));
    if (linear.num_v_heads % linear.num_heads != 0)
      return absl::InvalidArgumentError(
          "linear attention value heads must be a multiple of key heads");
    if (linear.conv_kernel < 1 || linear.conv_kernel > 16)
      return absl::InvalidArgumentError(absl::StrCat(
          "short convolution kernel size must be in [1, 16], got ", linear.conv_kernel));
    if (linear.gate_lower_bound > 0.0f)
      return absl::InvalidArgumentError("gate lower bound must be <= 0");
  }
  if (any_mla) {
    LOOM_RETURN_IF_ERROR(positive(mla.num_heads, "num_attention_heads"));
    LOOM_RETURN_IF_ERROR(positive(mla.kv_lora_rank, "kv_lora_rank"));
    LOOM_RETURN_IF_ERROR(positive(mla.qk_nope_head_dim, "qk_nope_head_dim"));
    LOOM_RETURN_IF_ERROR(positive(mla.v_head_dim, "v_head_dim"));
    if (mla.qk_rope_head_dim < 0 || mla.q_lora_rank < 0)
      return absl::InvalidArgumentError("qk_rope_head_dim and q_lora_rank must be >= 0");
  }
  if (any_moe) {
    LOOM_RETURN_IF_ERROR(positive(moe.num_experts, "num_experts"));
    LOOM_RETURN_IF_ERROR(positive(moe.top_k, "num_experts_per_tok"));
    LOOM_RETURN_IF_ERROR(positive(moe.intermediate_size, "moe_intermediate_size"));
    if (moe.top_k > moe.num_experts)
      return absl::InvalidArgumentError(absl::StrCat(
          "num_experts_per_tok (", moe.top_k, ") exceeds num_experts (", moe.num_experts, ")"));
    LOOM_RETURN_IF_ERROR(positive(moe.n_group, "n_group"));
    if (moe.num_experts % moe.n_group != 0)
      return absl::InvalidArgumentError(absl::StrCat(
          "num_experts (", moe.num_experts, ") is not a multiple of n_group (", moe.n_group, ")"));
    if (moe.topk_group < 1 || moe.topk_group > moe.n_group)
      return absl::InvalidArgumentError(absl::StrCat(
          "topk_group must be in [1, n_group = ", moe.n_group, "], got ", moe.topk_group));
    if (moe.n_group > 1 && moe.num_experts / moe.n_group < 2)
      return absl::InvalidArgumentError("grouped routing needs at least 2 experts per group");
    if (moe.top_k > (moe.num_experts / moe.n_group) * moe.topk_group)
      return absl::InvalidArgumentError(
          "num_experts_per_tok exceeds the experts in the kept groups");
    if (moe.num_shared_experts > 0)
      LOOM_RETURN_IF_ERROR(positive(moe.shared_intermediate_size, "shared expert width"));
  }
  if (any_dense) LOOM_RETURN_IF_ERROR(positive(intermediate_size, "intermediate_size"));
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> parse_model_config(std::string_view json_text) {
  // A config.json is a few KB; a huge one is an attack or a mistake, not a model.
  constexpr size_t kMaxConfigBytes = 4u << 20;
  if (json_text.size() > kMaxConfigBytes)
    return absl::InvalidArgumentError(absl::StrCat("config.json is ", json_text.size(),
                                                   " bytes; the limit is ", kMaxConfigBytes));
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("config.json is not valid JSON");
  if (!j.is_object()) return absl::InvalidArgumentError("config.json must hold a JSON object");
  auto it = j.find("model_type");
  if (it == j.end() || !it->is_string())
    return absl::InvalidArgumentError("config.json: missing string field 'model_type'");
  const std::string type = it->get<std::string>();
  absl::StatusOr<ModelConfig> cfg;
  if (type == "kimi_linear") {
    cfg = parse_kimi_linear_config(j);
  } else if (type == "deepseek_v3") {
    cfg = parse_deepseek_v3_config(j);
  } else if (type == "qwen3_next") {
    cfg = parse_qwen3_next_config(j);
  } else if (type == "kda") {
    cfg = parse_fla_kda_config(j);
  } else if (type == "loom") {
    cfg = parse_loom_config(j);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: unsupported model_type '", type,
                     "' (supported: kimi_linear, deepseek_v3, qwen3_next, kda, loom)"));
  }
  if (!cfg.ok())
    return absl::Status(cfg.status().code(),
                        absl::StrCat("config.json (", type, "): ", cfg.status().message()));
  cfg->model_type = type;
  absl::Status st = cfg->validate();
  if (!st.ok())
    return absl::InvalidArgumentError(absl::StrCat("config.json (", type, "): ", st.message()));
  return cfg;
}

absl::StatusOr<ModelConfig> load_model_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  absl::StatusOr<ModelConfig> cfg = parse_model_config(ss.str());
  if (!cfg.ok())
    return absl::Status(cfg.status().code(), absl::StrCat(path, ": ", cfg.status().message()));
  return cfg;
}

}  // namespace loom
