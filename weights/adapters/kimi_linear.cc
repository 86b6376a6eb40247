// kimi_linear (HuggingFace transformers `KimiLinearForCausalLM` checkpoints).

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "weights/adapters/adapters.h"
#include "weights/adapters/common.h"
#include "weights/json_fields.h"

namespace loom {

using adapter::single;
using adapter::split_layer;
using json_fields::get_bool_or;
using json_fields::get_int;
using json_fields::get_int_list;
using json_fields::get_int_or;
using json_fields::get_number_or;
using json_fields::get_string_list;

absl::StatusOr<ModelConfig> parse_kimi_linear_config(const nlohmann::json& j) {
  ModelConfig c;
  LOOM_RETURN_IF_ERROR(
      adapter::parse_common_fields(j, "rms_norm_eps", 1e-5, "model_max_length", 1 << 20, &c));
  LOOM_ASSIGN_OR_RETURN(c.intermediate_size, get_int_or(j, "intermediate_size", 0));

  // Linear attention: the checkpoint's linear_attn_config sub-dict wins over flat fields.
  const nlohmann::json empty = nlohmann::json::object();
  const auto lac_it = j.find("linear_attn_config");
  const nlohmann::json& lac = (lac_it != j.end() && lac_it->is_object()) ? *lac_it : empty;
  if (lac_it != j.end() && !lac_it->is_object() && !lac_it->is_null())
    return absl::InvalidArgumentError("field 'linear_attn_config' must be an object");
  LOOM_ASSIGN_OR_RETURN(int flat_heads, get_int_or(j, "linear_num_heads", 32));
  LOOM_ASSIGN_OR_RETURN(int flat_dim, get_int_or(j, "linear_head_dim", 128));
  LOOM_ASSIGN_OR_RETURN(int flat_conv, get_int_or(j, "linear_conv_kernel_dim", 4));
  LOOM_ASSIGN_OR_RETURN(c.linear.num_heads, get_int_or(lac, "num_heads", flat_heads));
  LOOM_ASSIGN_OR_RETURN(c.linear.head_dim, get_int_or(lac, "head_dim", flat_dim));
  LOOM_ASSIGN_OR_RETURN(c.linear.conv_kernel, get_int_or(lac, "short_conv_kernel_size", flat_conv));
  c.linear.num_v_heads = c.linear.num_heads;
  c.linear.v_head_dim = c.linear.head_dim;
  c.linear.gate_lower_bound = 0.0f;  // kimi_linear uses the softplus gate
  c.linear.gate_rank = c.linear.head_dim;

  // Layer types: `layer_types` if present, else the 1-indexed kda_layers / full_attn_layers.
  LOOM_ASSIGN_OR_RETURN(std::vector<std::string> types, get_string_list(j, "layer_types"));
  LOOM_ASSIGN_OR_RETURN(std::vector<int> kda_layers, get_int_list(lac, "kda_layers"));
  LOOM_ASSIGN_OR_RETURN(std::vector<int> full_layers, get_int_list(lac, "full_attn_layers"));
  std::vector<int> from_lists(c.num_layers, -1);  // 0 kda, 1 mla
  const bool have_lists = !kda_layers.empty() || !full_layers.empty();
  if (have_lists) {
    for (auto [list, kind, name] : {std::tuple{&kda_layers, 0, "kda_layers"},
                                    std::tuple{&full_layers, 1, "full_attn_layers"}}) {
      for (int l : *list) {
        if (l < 1 || l > c.num_layers)
          return absl::InvalidArgumentError(absl::StrCat("linear_attn_config.", name, ": layer ", l,
                                                         " outside [1, ", c.num_layers,
                                                         "] (these lists are 1-indexed)"));
        if (from_lists[l - 1] != -1)
          return absl::InvalidArgumentError(absl::StrCat(
              "linear_attn_config: layer ", l, " is listed twice (kda_layers / full_attn_layers)"));
        from_lists[l - 1] = kind;
      }
    }
    for (int i = 0; i < c.num_layers; ++i)
      if (from_lists[i] == -1)
        return absl::InvalidArgumentError(absl::StrCat(
            "linear_attn_config: layer ", i + 1, " is in neither kda_layers nor full_attn_layers"));
  }
  if (!types.empty()) {
    if (static_cast<int>(types.size()) != c.num_layers)
      return absl::InvalidArgumentError(absl::StrCat("field 'layer_types' has ", types.size(),
                                                     " entries; expected ", c.num_layers));
    for (int i = 0; i < c.num_layers; ++i) {
      int kind;
      if (types[i] == "linear_attention") {
        kind = 0;
      } else if (types[i] == "full_attention") {
        kind = 1;
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("layer_types[", i, "] = '", types[i],
                         "'; expected linear_attention or full_attention"));
      }
      if (have_lists && from_lists[i] != kind)
        return absl::InvalidArgumentError(absl::StrCat(
            "layer_types[", i, "] = '", types[i],
            "' contradicts linear_attn_config's kda_layers/full_attn_layers (1-indexed)"));
      c.mixers.push_back(kind == 0 ? MixerType::kKda : MixerType::kMla);
    }
  } else if (have_lists) {
    for (int k : from_lists) c.mixers.push_back(k == 0 ? MixerType::kKda : MixerType::kMla);
  } else {
    return absl::InvalidArgumentError(
        "kimi_linear config needs 'layer_types' or linear_attn_config.kda_layers/full_attn_layers");
  }

  // FFN types: mlp_layer_types if present, else first_k_dense_replace.
  LOOM_ASSIGN_OR_RETURN(std::vector<std::string> mlp_types, get_string_list(j, "mlp_layer_types"));
  if (!mlp_types.empty()) {
    if (static_cast<int>(mlp_types.size()) != c.num_layers)
      return absl::InvalidArgumentError(absl::StrCat(
          "field 'mlp_layer_types' has ", mlp_types.size(), " entries; expected ", c.num_layers));
    for (int i = 0; i < c.num_layers; ++i) {
      if (mlp_types[i] == "dense") {
        c.ffns.push_back(FfnType::kDense);
      } else if (mlp_types[i] == "sparse") {
        c.ffns.push_back(FfnType::kMoe);
      } else {
        return absl::InvalidArgumentError(absl::StrCat("mlp_layer_types[", i, "] = '", mlp_types[i],
                                                       "'; expected dense or sparse"));
      }
    }
  } else {
    LOOM_ASSIGN_OR_RETURN(int first_dense, get_int_or(j, "first_k_dense_replace", 1));
    for (int i = 0; i < c.num_layers; ++i)
      c.ffns.push_back(i < first_dense ? FfnType::kDense : FfnType::kMoe);
  }

  // MLA (NoPE: kimi_linear applies no rotary embedding; the rope part of the key is still shared).
  LOOM_ASSIGN_OR_RETURN(c.mla.num_heads, get_int(j, "num_attention_heads"));
  LOOM_ASSIGN_OR_RETURN(int kv_heads, get_int_or(j, "num_key_value_heads", c.mla.num_heads));
  if (kv_heads != c.mla.num_heads)
    return absl::InvalidArgumentError(absl::StrCat("num_key_value_heads (", kv_heads,
                                                   ") must equal num_attention_heads (",
                                                   c.mla.num_heads, ") for MLA"));
  LOOM_ASSIGN_OR_RETURN(c.mla.q_lora_rank, get_int_or(j, "q_lora_rank", 0));
  LOOM_ASSIGN_OR_RETURN(c.mla.kv_lora_rank, get_int(j, "kv_lora_rank"));
  LOOM_ASSIGN_OR_RETURN(c.mla.qk_nope_head_dim, get_int(j, "qk_nope_head_dim"));
  LOOM_ASSIGN_OR_RETURN(c.mla.qk_rope_head_dim, get_int(j, "qk_rope_head_dim"));
  LOOM_ASSIGN_OR_RETURN(c.mla.v_head_dim, get_int(j, "v_head_dim"));
  c.rope.type = RopeConfig::Type::kNone;
  LOOM_ASSIGN_OR_RETURN(bool attn_bias, get_bool_or(j, "attention_bias", false));
  if (attn_bias)
    return absl::InvalidArgumentError("attention_bias = true is not supported for kimi_linear");

  // MoE.
  LOOM_ASSIGN_OR_RETURN(c.moe.num_experts, get_int_or(j, "num_experts", 0));
  LOOM_ASSIGN_OR_RETURN(c.moe.top_k, get_int_or(j, "num_experts_per_token", 0));
  LOOM_ASSIGN_OR_RETURN(c.moe.intermediate_size, get_int_or(j, "moe_intermediate_size", 0));
  LOOM_ASSIGN_OR_RETURN(c.moe.num_shared_experts, get_int_or(j, "num_shared_experts", 1));
  c.moe.shared_intermediate_size = c.moe.intermediate_size * c.moe.num_shared_experts;
  LOOM_ASSIGN_OR_RETURN(c.moe.n_group, get_int_or(j, "num_expert_group", 1));
  LOOM_ASSIGN_OR_RETURN(c.moe.topk_group, get_int_or(j, "topk_group", 1));
  LOOM_ASSIGN_OR_RETURN(c.moe.renormalize, get_bool_or(j, "moe_renormalize", true));
  LOOM_ASSIGN_OR_RETURN(double scaling, get_number_or(j, "routed_scaling_factor", 1.0));
  c.moe.routed_scaling = static_cast<float>(scaling);
  c.moe.score_sigmoid = true;
  c.moe.has_score_bias = true;
  if (auto it = j.find("moe_router_activation_func");
      it != j.end() && it->is_string() && *it != "sigmoid")
    return absl::InvalidArgumentError(absl::StrCat("moe_router_activation_func ", it->dump(),
                                                   " is not supported (sigmoid only)"));
  LOOM_ASSIGN_OR_RETURN(std::string act, json_fields::get_string(j, "hidden_act"));
  if (act != "silu")
    return absl::InvalidArgumentError(
        absl::StrCat("hidden_act '", act, "' unsupported (silu only)"));
  return c;
}

absl::StatusOr<TensorSource> kimi_linear_tensor_source(const ModelConfig& cfg,
                                                       std::string_view canonical) {
  if (canonical == "embed.weight") return single("model.embed_tokens.weight");
  if (canonical == "final_norm.weight") return single("model.norm.weight");
  if (canonical == "lm_head.weight")
    return single(cfg.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  int l = 0;
  std::string_view rest;
  if (!split_layer(canonical, &l, &rest))
    return absl::NotFoundError(
        absl::StrCat("kimi_linear has no tensor for '", absl_sv(canonical), "'"));
  const std::string p = absl::StrCat("model.layers.", l, ".");
  const std::string attn = p + "self_attn.";
  const std::string moe = p + "block_sparse_moe.";
  if (rest == "mixer_norm.weight") return single(p + "input_layernorm.weight");
  if (rest == "ffn_norm.weight") return single(p + "post_attention_layernorm.weight");
  // KDA
  if (rest == "kda.qkv_proj.weight")
    return TensorSource{TensorSource::Combine::kConcat,
                        {attn + "q_proj.weight", attn + "k_proj.weight", attn + "v_proj.weight"}};
  if (rest == "kda.conv.weight")
    return TensorSource{
        TensorSource::Combine::kConcat,
        {attn + "q_conv1d.weight", attn + "k_conv1d.weight", attn + "v_conv1d.weight"}};
  static const std::pair<std::string_view, std::string_view> kDirect[] = {
      {"kda.f_a.weight", "self_attn.f_a_proj.weight"},
      {"kda.f_b.weight", "self_attn.f_b_proj.weight"},
      {"kda.dt_bias", "self_attn.dt_bias"},
      {"kda.A_log", "self_attn.A_log"},
      {"kda.b_proj.weight", "self_attn.b_proj.weight"},
      {"kda.g_a.weight", "self_attn.g_a_proj.weight"},
      {"kda.g_b.weight", "self_attn.g_b_proj.weight"},
      {"kda.o_norm.weight", "self_attn.o_norm.weight"},
      {"kda.o_proj.weight", "self_attn.o_proj.weight"},
      {"mla.q_proj.weight", "self_attn.q_proj.weight"},
      {"mla.q_a_proj.weight", "self_attn.q_a_proj.weight"},
      {"mla.q_a_norm.weight", "self_attn.q_a_layernorm.weight"},
      {"mla.q_b_proj.weight", "self_attn.q_b_proj.weight"},
      {"mla.kv_a_proj.weight", "self_attn.kv_a_proj_with_mqa.weight"},
      {"mla.kv_a_norm.weight", "self_attn.kv_a_layernorm.weight"},
      {"mla.kv_b_proj.weight", "self_attn.kv_b_proj.weight"},
      {"mla.o_proj.weight", "self_attn.o_proj.weight"},
      // kimi_linear keeps its dense MLP under block_sparse_moe as well.
      {"mlp.gate_proj.weight", "block_sparse_moe.gate_proj.weight"},
      {"mlp.up_proj.weight", "block_sparse_moe.up_proj.weight"},
      {"mlp.down_proj.weight", "block_sparse_moe.down_proj.weight"},
      {"moe.router.weight", "block_sparse_moe.gate.weight"},
      {"moe.router.bias", "block_sparse_moe.gate.e_score_correction_bias"},
      {"moe.shared.gate_proj.weight", "block_sparse_moe.shared_experts.gate_proj.weight"},
      {"moe.shared.up_proj.weight", "block_sparse_moe.shared_experts.up_proj.weight"},
      {"moe.shared.down_proj.weight", "block_sparse_moe.shared_experts.down_proj.weight"},
  };
  for (const auto& [canon, hf] : kDirect)
    if (rest == canon) return single(absl::StrCat(p, absl_sv(hf)));
  static const std::pair<std::string_view, std::string_view> kExperts[] = {
      {"moe.experts.gate", "w1"}, {"moe.experts.up", "w3"}, {"moe.experts.down", "w2"}};
  for (const auto& [canon, w] : kExperts) {
    if (rest != canon) continue;
    TensorSource src{TensorSource::Combine::kStack, {}};
    for (int e = 0; e < cfg.moe.num_experts; ++e)
      src.names.push_back(absl::StrCat(moe, "experts.", e, ".", absl_sv(w), ".weight"));
    return src;
  }
  return absl::NotFoundError(
      absl::StrCat("kimi_linear has no tensor for '", absl_sv(canonical), "'"));
}

}  // namespace loom
