// qwen3_next (HuggingFace transformers `Qwen3NextForCausalLM` checkpoints): Gated DeltaNet and
// gated GQA layers, zero-centred RMSNorm, softmax router and a sigmoid-gated shared expert.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "weights/adapters/adapters.h"
#include "weights/adapters/common.h"
#include "weights/json_fields.h"

namespace loom {

using json_fields::get_bool_or;
using json_fields::get_int;
using json_fields::get_int_list;
using json_fields::get_int_or;
using json_fields::get_number_or;
using json_fields::get_string_list;

absl::StatusOr<ModelConfig> parse_qwen3_next_config(const nlohmann::json& j) {
  ModelConfig c;
  LOOM_RETURN_IF_ERROR(
      adapter::parse_common_fields(j, "rms_norm_eps", 1e-6, "max_position_embeddings", 32768, &c));
  LOOM_ASSIGN_OR_RETURN(c.intermediate_size, get_int_or(j, "intermediate_size", 0));
  c.norm_weight_offset = 1.0f;  // Qwen3NextRMSNorm: (1 + w) * x̂
  LOOM_RETURN_IF_ERROR(adapter::require_silu(j, "hidden_act"));
  LOOM_RETURN_IF_ERROR(adapter::reject_true(j, "attention_bias", "qwen3_next"));

  LOOM_ASSIGN_OR_RETURN(std::vector<std::string> types, get_string_list(j, "layer_types"));
  if (types.empty()) {
    LOOM_ASSIGN_OR_RETURN(int interval, get_int_or(j, "full_attention_interval", 4));
    if (interval <= 0)
      return absl::InvalidArgumentError("field 'full_attention_interval' must be > 0");
    for (int i = 0; i < c.num_layers; ++i)
      types.push_back((i + 1) % interval ? "linear_attention" : "full_attention");
  }
  if (static_cast<int>(types.size()) != c.num_layers)
    return absl::InvalidArgumentError(absl::StrCat("field 'layer_types' has ", types.size(),
                                                   " entries; expected ", c.num_layers));
  for (int i = 0; i < c.num_layers; ++i) {
    if (types[i] == "linear_attention") {
      c.mixers.push_back(MixerType::kGdn);
    } else if (types[i] == "full_attention") {
      c.mixers.push_back(MixerType::kGqa);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer_types[", i, "] = '", types[i], "'; expected linear_attention or full_attention"));
    }
  }

  LinearAttentionConfig& la = c.linear;
  LOOM_ASSIGN_OR_RETURN(la.num_heads, get_int_or(j, "linear_num_key_heads", 16));
  LOOM_ASSIGN_OR_RETURN(la.num_v_heads, get_int_or(j, "linear_num_value_heads", 32));
  LOOM_ASSIGN_OR_RETURN(la.head_dim, get_int_or(j, "linear_key_head_dim", 128));
  LOOM_ASSIGN_OR_RETURN(la.v_head_dim, get_int_or(j, "linear_value_head_dim", 128));
  LOOM_ASSIGN_OR_RETURN(la.conv_kernel, get_int_or(j, "linear_conv_kernel_dim", 4));
  la.gate_lower_bound = 0.0f;

  LOOM_ASSIGN_OR_RETURN(c.gqa.num_heads, get_int(j, "num_attention_heads"));
  LOOM_ASSIGN_OR_RETURN(c.gqa.num_kv_heads, get_int_or(j, "num_key_value_heads", c.gqa.num_heads));
  LOOM_ASSIGN_OR_RETURN(c.gqa.head_dim,
                        get_int_or(j, "head_dim", c.hidden_size / std::max(c.gqa.num_heads, 1)));
  c.gqa.qk_norm = true;
  c.gqa.output_gate = true;
  LOOM_ASSIGN_OR_RETURN(c.rope, adapter::parse_rope(j, 10000.0, 0.25));

  LOOM_ASSIGN_OR_RETURN(c.moe.num_experts, get_int_or(j, "num_experts", 0));
  LOOM_ASSIGN_OR_RETURN(c.moe.top_k, get_int_or(j, "num_experts_per_tok", 0));
  LOOM_ASSIGN_OR_RETURN(c.moe.intermediate_size, get_int_or(j, "moe_intermediate_size", 0));
  LOOM_ASSIGN_OR_RETURN(c.moe.shared_intermediate_size,
                        get_int_or(j, "shared_expert_intermediate_size", 0));
  c.moe.num_shared_experts = c.moe.shared_intermediate_size > 0 ? 1 : 0;
  c.moe.shared_expert_gate = c.moe.num_shared_experts > 0;
  c.moe.score_sigmoid = false;
  c.moe.has_score_bias = false;
  LOOM_ASSIGN_OR_RETURN(c.moe.renormalize, get_bool_or(j, "norm_topk_prob", true));
  LOOM_ASSIGN_OR_RETURN(std::vector<int> mlp_only, get_int_list(j, "mlp_only_layers"));
  LOOM_ASSIGN_OR_RETURN(int sparse_step, get_int_or(j, "decoder_sparse_step", 1));
  if (sparse_step <= 0)
    return absl::InvalidArgumentError("field 'decoder_sparse_step' must be > 0");
  for (int l : mlp_only)
    if (l < 0 || l >= c.num_layers)
      return absl::InvalidArgumentError(
          absl::StrCat("mlp_only_layers: layer ", l, " outside [0, ", c.num_layers, ")"));
  for (int i = 0; i < c.num_layers; ++i) {
    const bool only_mlp = std::find(mlp_only.begin(), mlp_only.end(), i) != mlp_only.end();
    c.ffns.push_back(!only_mlp && c.moe.num_experts > 0 && (i + 1) % sparse_step == 0
                         ? FfnType::kMoe
                         : FfnType::kDense);
  }
  return c;
}

absl::StatusOr<TensorSource> qwen3_next_tensor_source(const ModelConfig& cfg,
                                                      std::string_view canonical) {
  using adapter::RowRanges;
  using adapter::single;
  if (canonical == "embed.weight") return single("model.embed_tokens.weight");
  if (canonical == "final_norm.weight") return single("model.norm.weight");
  if (canonical == "lm_head.weight")
    return single(cfg.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  int l = 0;
  std::string_view rest;
  if (!adapter::split_layer(canonical, &l, &rest))
    return adapter::not_found("qwen3_next", canonical);
  const std::string p = absl::StrCat("model.layers.", l, ".");
  static const std::vector<std::pair<std::string_view, std::string_view>> kTable = {
      {"mixer_norm.weight", "input_layernorm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"gdn.conv.weight", "linear_attn.conv1d.weight"},
      {"gdn.A_log", "linear_attn.A_log"},
      {"gdn.dt_bias", "linear_attn.dt_bias"},
      {"gdn.norm.weight", "linear_attn.norm.weight"},
      {"gdn.o_proj.weight", "linear_attn.out_proj.weight"},
      {"gqa.k_proj.weight", "self_attn.k_proj.weight"},
      {"gqa.v_proj.weight", "self_attn.v_proj.weight"},
      {"gqa.o_proj.weight", "self_attn.o_proj.weight"},
      {"gqa.q_norm.weight", "self_attn.q_norm.weight"},
      {"gqa.k_norm.weight", "self_attn.k_norm.weight"},
      {"mlp.gate_proj.weight", "mlp.gate_proj.weight"},
      {"mlp.up_proj.weight", "mlp.up_proj.weight"},
      {"mlp.down_proj.weight", "mlp.down_proj.weight"},
      {"moe.router.weight", "mlp.gate.weight"},
      {"moe.shared.gate_proj.weight", "mlp.shared_expert.gate_proj.weight"},
      {"moe.shared.up_proj.weight", "mlp.shared_expert.up_proj.weight"},
      {"moe.shared.down_proj.weight", "mlp.shared_expert.down_proj.weight"},
      {"moe.shared_gate.weight", "mlp.shared_expert_gate.weight"},
  };
  TensorSource src;
  if (adapter::lookup(rest, kTable, p, &src)) return src;

  const LinearAttentionConfig& la = cfg.linear;
  const int64_t hk = la.num_heads, dk = la.head_dim, dv = la.v_head_dim;
  const int64_t r = la.num_heads > 0 ? la.num_v_heads / la.num_heads : 0;
  if (rest == "gdn.qkvz_proj.weight") {
    // Checkpoint rows: per key head g, [q (dk) | k (dk) | v (r*dv) | z (r*dv)].
    const int64_t group = 2 * dk + 2 * r * dv;
    RowRanges ranges;
    const int64_t offsets[4] = {0, dk, 2 * dk, 2 * dk + r * dv};
    const int64_t widths[4] = {dk, dk, r * dv, r * dv};
    for (int part = 0; part < 4; ++part)
      for (int64_t g = 0; g < hk; ++g)
        ranges.emplace_back(g * group + offsets[part], g * group + offsets[part] + widths[part]);
    src = single(p + "linear_attn.in_proj_qkvz.weight");
    src.transform = adapter::gather_rows_transform(std::move(ranges));
    return src;
  }
  if (rest == "gdn.ba_proj.weight") {
    // Checkpoint rows: per key head g, [b (r) | a (r)].
    RowRanges ranges;
    for (int part = 0; part < 2; ++part)
      for (int64_t g = 0; g < hk; ++g)
        ranges.emplace_back(g * 2 * r + part * r, g * 2 * r + (part + 1) * r);
    src = single(p + "linear_attn.in_proj_ba.weight");
    src.transform = adapter::gather_rows_transform(std::move(ranges));
    return src;
  }
  if (rest == "gqa.q_proj.weight" || rest == "gqa.gate_proj.weight") {
    // Checkpoint rows: per query head h, [q (hd) | gate (hd)].
    const int64_t hd = cfg.gqa.head_dim, off = rest == "gqa.q_proj.weight" ? 0 : hd;
    RowRanges ranges;
    for (int64_t h = 0; h < cfg.gqa.num_heads; ++h)
      ranges.emplace_back(h * 2 * hd + off, h * 2 * hd + off + hd);
    src = single(p + "self_attn.q_proj.weight");
    src.transform = adapter::gather_rows_transform(std::move(ranges));
    return src;
  }
  const std::string experts = p + "mlp.experts.";
  const int e = cfg.moe.num_experts;
  if (rest == "moe.experts.gate") return adapter::stacked_experts(experts, e, ".gate_proj.weight");
  if (rest == "moe.experts.up") return adapter::stacked_experts(experts, e, ".up_proj.weight");
  if (rest == "moe.experts.down") return adapter::stacked_experts(experts, e, ".down_proj.weight");
  return adapter::not_found("qwen3_next", canonical);
}

}  // namespace loom
