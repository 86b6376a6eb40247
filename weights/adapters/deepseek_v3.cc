// deepseek_v3 (HuggingFace transformers `DeepseekV3ForCausalLM` checkpoints): MLA with q-LoRA and
// decoupled RoPE (interleaved pairs, YaRN), grouped top-k sigmoid routing, dense first layers.
// Multi-token-prediction layers (num_nextn_predict_layers) are not part of the forward pass and are
// not loaded.
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

absl::StatusOr<ModelConfig> parse_deepseek_v3_config(const nlohmann::json& j) {
  ModelConfig c;
  LOOM_RETURN_IF_ERROR(
      adapter::parse_common_fields(j, "rms_norm_eps", 1e-6, "max_position_embeddings", 4096, &c));
  LOOM_ASSIGN_OR_RETURN(c.intermediate_size, get_int_or(j, "intermediate_size", 0));
  LOOM_RETURN_IF_ERROR(adapter::require_silu(j, "hidden_act"));
  LOOM_RETURN_IF_ERROR(adapter::reject_true(j, "attention_bias", "deepseek_v3"));

  LOOM_ASSIGN_OR_RETURN(c.mla.num_heads, get_int(j, "num_attention_heads"));
  LOOM_ASSIGN_OR_RETURN(int kv_heads, get_int_or(j, "num_key_value_heads", c.mla.num_heads));
  if (kv_heads != c.mla.num_heads)
    return absl::InvalidArgumentError(absl::StrCat("num_key_value_heads (", kv_heads,
                                                   ") must equal num_attention_heads for MLA"));
  LOOM_ASSIGN_OR_RETURN(c.mla.q_lora_rank, get_int_or(j, "q_lora_rank", 0));
  LOOM_ASSIGN_OR_RETURN(c.mla.kv_lora_rank, get_int(j, "kv_lora_rank"));
  LOOM_ASSIGN_OR_RETURN(c.mla.qk_nope_head_dim, get_int(j, "qk_nope_head_dim"));
  LOOM_ASSIGN_OR_RETURN(c.mla.qk_rope_head_dim, get_int(j, "qk_rope_head_dim"));
  LOOM_ASSIGN_OR_RETURN(c.mla.v_head_dim, get_int(j, "v_head_dim"));
  LOOM_ASSIGN_OR_RETURN(c.rope, adapter::parse_rope(j, 10000.0, 1.0));
  LOOM_ASSIGN_OR_RETURN(c.rope.interleaved, get_bool_or(j, "rope_interleave", true));
  if (c.mla.qk_rope_head_dim % 2 != 0)
    return absl::InvalidArgumentError("qk_rope_head_dim must be even for RoPE");

  LOOM_ASSIGN_OR_RETURN(int first_dense, get_int_or(j, "first_k_dense_replace", 3));
  LOOM_ASSIGN_OR_RETURN(int freq, get_int_or(j, "moe_layer_freq", 1));
  if (freq != 1)
    return absl::InvalidArgumentError("moe_layer_freq != 1 is not supported for deepseek_v3");
  for (int i = 0; i < c.num_layers; ++i) {
    c.mixers.push_back(MixerType::kMla);
    c.ffns.push_back(i < first_dense ? FfnType::kDense : FfnType::kMoe);
  }
  LOOM_ASSIGN_OR_RETURN(c.moe.num_experts, get_int_or(j, "n_routed_experts", 0));
  LOOM_ASSIGN_OR_RETURN(c.moe.top_k, get_int_or(j, "num_experts_per_tok", 0));
  LOOM_ASSIGN_OR_RETURN(c.moe.intermediate_size, get_int_or(j, "moe_intermediate_size", 0));
  LOOM_ASSIGN_OR_RETURN(c.moe.num_shared_experts, get_int_or(j, "n_shared_experts", 1));
  c.moe.shared_intermediate_size = c.moe.intermediate_size * c.moe.num_shared_experts;
  LOOM_ASSIGN_OR_RETURN(c.moe.n_group, get_int_or(j, "n_group", 1));
  LOOM_ASSIGN_OR_RETURN(c.moe.topk_group, get_int_or(j, "topk_group", 1));
  LOOM_ASSIGN_OR_RETURN(c.moe.renormalize, get_bool_or(j, "norm_topk_prob", true));
  LOOM_ASSIGN_OR_RETURN(double scaling, get_number_or(j, "routed_scaling_factor", 1.0));
  c.moe.routed_scaling = static_cast<float>(scaling);
  c.moe.score_sigmoid = true;
  c.moe.has_score_bias = true;
  if (auto it = j.find("scoring_func"); it != j.end() && it->is_string() && *it != "sigmoid")
    return absl::InvalidArgumentError(
        absl::StrCat("scoring_func ", it->dump(), " is not supported (sigmoid only)"));
  if (auto it = j.find("topk_method"); it != j.end() && it->is_string() && *it != "noaux_tc")
    return absl::InvalidArgumentError(
        absl::StrCat("topk_method ", it->dump(), " is not supported (noaux_tc only)"));
  return c;
}

absl::StatusOr<TensorSource> deepseek_v3_tensor_source(const ModelConfig& cfg,
                                                       std::string_view canonical) {
  using adapter::single;
  if (canonical == "embed.weight") return single("model.embed_tokens.weight");
  if (canonical == "final_norm.weight") return single("model.norm.weight");
  if (canonical == "lm_head.weight")
    return single(cfg.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  int l = 0;
  std::string_view rest;
  if (!adapter::split_layer(canonical, &l, &rest))
    return adapter::not_found("deepseek_v3", canonical);
  const std::string p = absl::StrCat("model.layers.", l, ".");
  static const std::vector<std::pair<std::string_view, std::string_view>> kTable = {
      {"mixer_norm.weight", "input_layernorm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"mla.q_proj.weight", "self_attn.q_proj.weight"},
      {"mla.q_a_proj.weight", "self_attn.q_a_proj.weight"},
      {"mla.q_a_norm.weight", "self_attn.q_a_layernorm.weight"},
      {"mla.q_b_proj.weight", "self_attn.q_b_proj.weight"},
      {"mla.kv_a_proj.weight", "self_attn.kv_a_proj_with_mqa.weight"},
      {"mla.kv_a_norm.weight", "self_attn.kv_a_layernorm.weight"},
      {"mla.kv_b_proj.weight", "self_attn.kv_b_proj.weight"},
      {"mla.o_proj.weight", "self_attn.o_proj.weight"},
      {"mlp.gate_proj.weight", "mlp.gate_proj.weight"},
      {"mlp.up_proj.weight", "mlp.up_proj.weight"},
      {"mlp.down_proj.weight", "mlp.down_proj.weight"},
      {"moe.router.weight", "mlp.gate.weight"},
      {"moe.router.bias", "mlp.gate.e_score_correction_bias"},
      {"moe.shared.gate_proj.weight", "mlp.shared_experts.gate_proj.weight"},
      {"moe.shared.up_proj.weight", "mlp.shared_experts.up_proj.weight"},
      {"moe.shared.down_proj.weight", "mlp.shared_experts.down_proj.weight"},
  };
  TensorSource src;
  if (adapter::lookup(rest, kTable, p, &src)) return src;
  const std::string experts = p + "mlp.experts.";
  const int e = cfg.moe.num_experts;
  if (rest == "moe.experts.gate") return adapter::stacked_experts(experts, e, ".gate_proj.weight");
  if (rest == "moe.experts.up") return adapter::stacked_experts(experts, e, ".up_proj.weight");
  if (rest == "moe.experts.down") return adapter::stacked_experts(experts, e, ".down_proj.weight");
  return adapter::not_found("deepseek_v3", canonical);
}

}  // namespace loom
