// The native `loom` format: canonical tensor names as they are (docs/native-format.md) and a
// config.json that states every ModelConfig field explicitly.
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "weights/adapters/adapters.h"
#include "weights/adapters/common.h"
#include "weights/json_fields.h"

namespace loom {

using json_fields::get_bool_or;
using json_fields::get_int;
using json_fields::get_int_or;
using json_fields::get_number_or;
using json_fields::get_string_list;

namespace {

const nlohmann::json& section(const nlohmann::json& j, const char* key, bool* present) {
  static const nlohmann::json empty = nlohmann::json::object();
  auto it = j.find(key);
  *present = it != j.end() && it->is_object();
  return *present ? *it : empty;
}

absl::Status expect_object_or_absent(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it != j.end() && !it->is_null() && !it->is_object())
    return absl::InvalidArgumentError(absl::StrCat("field '", key, "' must be an object"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> parse_loom_config(const nlohmann::json& j) {
  ModelConfig c;
  LOOM_RETURN_IF_ERROR(
      adapter::parse_common_fields(j, "rms_norm_eps", 1e-6, "max_position_embeddings", 0, &c));
  LOOM_ASSIGN_OR_RETURN(c.intermediate_size, get_int_or(j, "intermediate_size", 0));
  LOOM_ASSIGN_OR_RETURN(double offset, get_number_or(j, "rms_norm_weight_offset", 0.0));
  if (offset != 0.0 && offset != 1.0)
    return absl::InvalidArgumentError("field 'rms_norm_weight_offset' must be 0 or 1");
  c.norm_weight_offset = static_cast<float>(offset);
  LOOM_ASSIGN_OR_RETURN(c.attnres_block_size, get_int_or(j, "attnres_block_size", 0));
  if (c.attnres_block_size < 0)
    return absl::InvalidArgumentError("field 'attnres_block_size' must be >= 0");

  LOOM_ASSIGN_OR_RETURN(std::vector<std::string> types, get_string_list(j, "layer_types"));
  if (static_cast<int>(types.size()) != c.num_layers)
    return absl::InvalidArgumentError(absl::StrCat("field 'layer_types' has ", types.size(),
                                                   " entries; expected ", c.num_layers));
  for (size_t i = 0; i < types.size(); ++i) {
    const std::string& t = types[i];
    if (t == "kda") {
      c.mixers.push_back(MixerType::kKda);
    } else if (t == "gdn") {
      c.mixers.push_back(MixerType::kGdn);
    } else if (t == "mla") {
      c.mixers.push_back(MixerType::kMla);
    } else if (t == "gqa") {
      c.mixers.push_back(MixerType::kGqa);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("layer_types[", i, "] = '", t, "'; expected kda, gdn, mla or gqa"));
    }
  }
  LOOM_ASSIGN_OR_RETURN(std::vector<std::string> mlp, get_string_list(j, "mlp_layer_types"));
  if (static_cast<int>(mlp.size()) != c.num_layers)
    return absl::InvalidArgumentError(absl::StrCat("field 'mlp_layer_types' has ", mlp.size(),
                                                   " entries; expected ", c.num_layers));
  for (size_t i = 0; i < mlp.size(); ++i) {
    if (mlp[i] == "dense") {
      c.ffns.push_back(FfnType::kDense);
    } else if (mlp[i] == "moe") {
      c.ffns.push_back(FfnType::kMoe);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("mlp_layer_types[", i, "] = '", mlp[i], "'; expected dense or moe"));
    }
  }

  for (const char* key : {"linear_attention", "mla", "gqa", "rope", "moe", "balance"})
    LOOM_RETURN_IF_ERROR(expect_object_or_absent(j, key));
  bool present = false;
  const nlohmann::json& la = section(j, "linear_attention", &present);
  LOOM_ASSIGN_OR_RETURN(c.linear.num_heads, get_int_or(la, "num_heads", 0));
  LOOM_ASSIGN_OR_RETURN(c.linear.num_v_heads, get_int_or(la, "num_v_heads", c.linear.num_heads));
  LOOM_ASSIGN_OR_RETURN(c.linear.head_dim, get_int_or(la, "head_dim", 0));
  LOOM_ASSIGN_OR_RETURN(c.linear.v_head_dim, get_int_or(la, "v_head_dim", c.linear.head_dim));
  LOOM_ASSIGN_OR_RETURN(c.linear.conv_kernel, get_int_or(la, "conv_kernel", 4));
  LOOM_ASSIGN_OR_RETURN(c.linear.gate_rank, get_int_or(la, "gate_rank", c.linear.head_dim));
  LOOM_ASSIGN_OR_RETURN(double lb, get_number_or(la, "gate_lower_bound", -5.0));
  c.linear.gate_lower_bound = static_cast<float>(lb);
  LOOM_ASSIGN_OR_RETURN(c.linear.output_gate_bias, get_bool_or(la, "output_gate_bias", false));

  const nlohmann::json& mla = section(j, "mla", &present);
  LOOM_ASSIGN_OR_RETURN(c.mla.num_heads, get_int_or(mla, "num_heads", 0));
  LOOM_ASSIGN_OR_RETURN(c.mla.q_lora_rank, get_int_or(mla, "q_lora_rank", 0));
  LOOM_ASSIGN_OR_RETURN(c.mla.kv_lora_rank, get_int_or(mla, "kv_lora_rank", 0));
  LOOM_ASSIGN_OR_RETURN(c.mla.qk_nope_head_dim, get_int_or(mla, "qk_nope_head_dim", 0));
  LOOM_ASSIGN_OR_RETURN(c.mla.qk_rope_head_dim, get_int_or(mla, "qk_rope_head_dim", 0));
  LOOM_ASSIGN_OR_RETURN(c.mla.v_head_dim, get_int_or(mla, "v_head_dim", 0));
  LOOM_ASSIGN_OR_RETURN(c.mla.output_gate, get_bool_or(mla, "output_gate", false));

  const nlohmann::json& gqa = section(j, "gqa", &present);
  LOOM_ASSIGN_OR_RETURN(c.gqa.num_heads, get_int_or(gqa, "num_heads", 0));
  LOOM_ASSIGN_OR_RETURN(c.gqa.num_kv_heads, get_int_or(gqa, "num_kv_heads", c.gqa.num_heads));
  LOOM_ASSIGN_OR_RETURN(c.gqa.head_dim, get_int_or(gqa, "head_dim", 0));
  LOOM_ASSIGN_OR_RETURN(c.gqa.qk_norm, get_bool_or(gqa, "qk_norm", false));
  LOOM_ASSIGN_OR_RETURN(c.gqa.output_gate, get_bool_or(gqa, "output_gate", false));

  const nlohmann::json& rope = section(j, "rope", &present);
  std::string rope_type = "none";
  if (auto it = rope.find("type"); it != rope.end()) {
    if (!it->is_string()) return absl::InvalidArgumentError("field 'rope.type' must be a string");
    rope_type = it->get<std::string>();
  }
  if (rope_type == "none") {
    c.rope.type = RopeConfig::Type::kNone;
  } else {
    nlohmann::json hf = {{"rope_type", rope_type}};
    for (auto it = rope.begin(); it != rope.end(); ++it)
      if (it.key() != "type" && it.key() != "interleaved") hf[it.key()] = it.value();
    nlohmann::json wrapper = {{"rope_parameters", hf}};
    LOOM_ASSIGN_OR_RETURN(c.rope, adapter::parse_rope(wrapper, 10000.0, 1.0));
  }
  LOOM_ASSIGN_OR_RETURN(c.rope.interleaved, get_bool_or(rope, "interleaved", false));

  const nlohmann::json& moe = section(j, "moe", &present);
  LOOM_ASSIGN_OR_RETURN(c.moe.num_experts, get_int_or(moe, "num_experts", 0));
  LOOM_ASSIGN_OR_RETURN(c.moe.top_k, get_int_or(moe, "top_k", 0));
  LOOM_ASSIGN_OR_RETURN(c.moe.intermediate_size, get_int_or(moe, "intermediate_size", 0));
  LOOM_ASSIGN_OR_RETURN(c.moe.num_shared_experts, get_int_or(moe, "num_shared_experts", 0));
  LOOM_ASSIGN_OR_RETURN(c.moe.shared_intermediate_size,
                        get_int_or(moe, "shared_intermediate_size",
                                   c.moe.num_shared_experts * c.moe.intermediate_size));
  LOOM_ASSIGN_OR_RETURN(c.moe.shared_expert_gate, get_bool_or(moe, "shared_expert_gate", false));
  std::string score = "sigmoid";
  if (auto it = moe.find("score"); it != moe.end()) {
    if (!it->is_string() || (*it != "sigmoid" && *it != "softmax"))
      return absl::InvalidArgumentError("field 'moe.score' must be \"sigmoid\" or \"softmax\"");
    score = it->get<std::string>();
  }
  c.moe.score_sigmoid = score == "sigmoid";
  LOOM_ASSIGN_OR_RETURN(c.moe.has_score_bias, get_bool_or(moe, "score_bias", c.moe.score_sigmoid));
  LOOM_ASSIGN_OR_RETURN(c.moe.n_group, get_int_or(moe, "n_group", 1));
  LOOM_ASSIGN_OR_RETURN(c.moe.topk_group, get_int_or(moe, "topk_group", 1));
  LOOM_ASSIGN_OR_RETURN(c.moe.renormalize, get_bool_or(moe, "renormalize", true));
  LOOM_ASSIGN_OR_RETURN(double scaling, get_number_or(moe, "routed_scaling", 1.0));
  c.moe.routed_scaling = static_cast<float>(scaling);
  if (c.moe.shared_expert_gate && c.moe.num_shared_experts == 0)
    return absl::InvalidArgumentError("moe.shared_expert_gate needs num_shared_experts > 0");

  const nlohmann::json& bal = section(j, "balance", &c.balance.enabled);
  LOOM_ASSIGN_OR_RETURN(c.balance.q_low, get_number_or(bal, "q_low", 0.25));
  LOOM_ASSIGN_OR_RETURN(c.balance.q_high, get_number_or(bal, "q_high", 0.75));
  LOOM_ASSIGN_OR_RETURN(c.balance.eta, get_number_or(bal, "eta", 1e-3));
  if (c.balance.enabled && !(0 <= c.balance.q_low && c.balance.q_low < c.balance.q_high &&
                             c.balance.q_high <= 1 && c.balance.eta > 0))
    return absl::InvalidArgumentError("balance: need 0 <= q_low < q_high <= 1 and eta > 0");
  return c;
}

absl::StatusOr<TensorSource> loom_tensor_source(const ModelConfig& cfg,
                                                std::string_view canonical) {
  if (canonical == "lm_head.weight" && cfg.tie_word_embeddings)
    return adapter::single("embed.weight");
  return adapter::single(std::string(canonical));
}

nlohmann::json native_config_json(const ModelConfig& c) {
  nlohmann::json j;
  j["model_type"] = "loom";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_layers;
  j["intermediate_size"] = c.intermediate_size;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rms_norm_weight_offset"] = c.norm_weight_offset;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["bos_token_id"] = c.bos_token_id;
  j["eos_token_id"] = c.eos_token_id;
  j["attnres_block_size"] = c.attnres_block_size;
  std::vector<std::string> types, mlp;
  for (MixerType m : c.mixers) types.emplace_back(mixer_type_name(m));
  for (FfnType f : c.ffns) mlp.emplace_back(f == FfnType::kDense ? "dense" : "moe");
  j["layer_types"] = types;
  j["mlp_layer_types"] = mlp;
  j["linear_attention"] = {{"num_heads", c.linear.num_heads},
                           {"num_v_heads", c.linear.num_v_heads},
                           {"head_dim", c.linear.head_dim},
                           {"v_head_dim", c.linear.v_head_dim},
                           {"conv_kernel", c.linear.conv_kernel},
                           {"gate_rank", c.linear.gate_rank},
                           {"gate_lower_bound", c.linear.gate_lower_bound},
                           {"output_gate_bias", c.linear.output_gate_bias}};
  j["mla"] = {{"num_heads", c.mla.num_heads},
              {"q_lora_rank", c.mla.q_lora_rank},
              {"kv_lora_rank", c.mla.kv_lora_rank},
              {"qk_nope_head_dim", c.mla.qk_nope_head_dim},
              {"qk_rope_head_dim", c.mla.qk_rope_head_dim},
              {"v_head_dim", c.mla.v_head_dim},
              {"output_gate", c.mla.output_gate}};
  j["gqa"] = {{"num_heads", c.gqa.num_heads},
              {"num_kv_heads", c.gqa.num_kv_heads},
              {"head_dim", c.gqa.head_dim},
              {"qk_norm", c.gqa.qk_norm},
              {"output_gate", c.gqa.output_gate}};
  const RopeConfig& r = c.rope;
  if (r.type == RopeConfig::Type::kNone) {
    j["rope"] = {{"type", "none"}};
  } else {
    j["rope"] = {{"type", r.type == RopeConfig::Type::kYarn ? "yarn" : "default"},
                 {"rope_theta", r.theta},
                 {"interleaved", r.interleaved},
                 {"partial_rotary_factor", r.partial_rotary_factor}};
    if (r.type == RopeConfig::Type::kYarn) {
      j["rope"]["factor"] = r.factor;
      j["rope"]["original_max_position_embeddings"] = r.original_max_position;
      j["rope"]["beta_fast"] = r.beta_fast;
      j["rope"]["beta_slow"] = r.beta_slow;
      j["rope"]["mscale"] = r.mscale;
      j["rope"]["mscale_all_dim"] = r.mscale_all_dim;
      j["rope"]["attention_factor"] = r.attention_factor;
      j["rope"]["truncate"] = r.truncate;
    }
  }
  if (c.fp8_block_rows > 0) {
    // FP8 matrices stored with their block scales (X, X_scale_inv), as DeepSeek-V3 declares them.
    j["quantization_config"] = {{"quant_method", "fp8"},
                                {"fmt", "e4m3"},
                                {"activation_scheme", "dynamic"},
                                {"weight_block_size", {c.fp8_block_rows, c.fp8_block_cols}}};
  }
  j["moe"] = {{"num_experts", c.moe.num_experts},
              {"top_k", c.moe.top_k},
              {"intermediate_size", c.moe.intermediate_size},
              {"num_shared_experts", c.moe.num_shared_experts},
              {"shared_intermediate_size", c.moe.shared_intermediate_size},
              {"shared_expert_gate", c.moe.shared_expert_gate},
              {"score", c.moe.score_sigmoid ? "sigmoid" : "softmax"},
              {"score_bias", c.moe.has_score_bias},
              {"n_group", c.moe.n_group},
              {"topk_group", c.moe.topk_group},
              {"renormalize", c.moe.renormalize},
              {"routed_scaling", c.moe.routed_scaling}};
  if (c.balance.enabled)
    j["balance"] = {
        {"q_low", c.balance.q_low}, {"q_high", c.balance.q_high}, {"eta", c.balance.eta}};
  return j;
}

}  // namespace loom
