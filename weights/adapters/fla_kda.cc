// kda (flash-linear-attention `KDAForCausalLM` checkpoints): KDA layers with the bounded gate and
// an output-gate bias, GQA layers with RoPE, dense SwiGLU MLPs and Block Attention Residuals.
#include <cmath>

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

absl::StatusOr<ModelConfig> parse_fla_kda_config(const nlohmann::json& j) {
  ModelConfig c;
  LOOM_RETURN_IF_ERROR(
      adapter::parse_common_fields(j, "norm_eps", 1e-6, "max_position_embeddings", 2048, &c));
  LOOM_RETURN_IF_ERROR(adapter::require_silu(j, "hidden_act"));
  LOOM_RETURN_IF_ERROR(adapter::reject_true(j, "allow_neg_eigval", "kda"));
  LOOM_RETURN_IF_ERROR(adapter::reject_true(j, "use_l2warp", "kda"));
  LOOM_ASSIGN_OR_RETURN(bool short_conv, get_bool_or(j, "use_short_conv", true));
  if (!short_conv) return absl::InvalidArgumentError("use_short_conv = false is not supported");

  // Dense MLP width: intermediate_size, else fla's GatedMLP rule from hidden_ratio (2/3 of
  // hidden * ratio, rounded up to a multiple of 256).
  LOOM_ASSIGN_OR_RETURN(c.intermediate_size, get_int_or(j, "intermediate_size", 0));
  if (c.intermediate_size == 0) {
    LOOM_ASSIGN_OR_RETURN(double ratio, get_number_or(j, "hidden_ratio", 4.0));
    const int64_t width = static_cast<int64_t>(c.hidden_size * ratio * 2 / 3);
    c.intermediate_size = static_cast<int>(256 * ((width + 255) / 256));
  }

  LinearAttentionConfig& la = c.linear;
  LOOM_ASSIGN_OR_RETURN(la.num_heads, get_int(j, "num_heads"));
  LOOM_ASSIGN_OR_RETURN(la.num_v_heads, get_int_or(j, "num_v_heads", la.num_heads));
  LOOM_ASSIGN_OR_RETURN(la.head_dim, get_int(j, "head_dim"));
  LOOM_ASSIGN_OR_RETURN(double expand_v, get_number_or(j, "expand_v", 1.0));
  la.v_head_dim = static_cast<int>(std::lround(la.head_dim * expand_v));
  if (std::abs(la.head_dim * expand_v - la.v_head_dim) > 1e-9)
    return absl::InvalidArgumentError("head_dim * expand_v must be an integer");
  la.gate_rank = la.v_head_dim;
  LOOM_ASSIGN_OR_RETURN(la.conv_kernel, get_int_or(j, "conv_size", 4));
  la.output_gate_bias = true;
  LOOM_ASSIGN_OR_RETURN(double lb, get_number_or(j, "lower_bound", 0.0));
  if (lb > 0) return absl::InvalidArgumentError("field 'lower_bound' must be < 0");
  la.gate_lower_bound = static_cast<float>(lb);

  // Attention layers (0-indexed in attn.layers).
  std::vector<int> attn_layers;
  auto attn_it = j.find("attn");
  if (attn_it != j.end() && !attn_it->is_null()) {
    const nlohmann::json& a = *attn_it;
    if (!a.is_object()) return absl::InvalidArgumentError("field 'attn' must be an object");
    LOOM_ASSIGN_OR_RETURN(attn_layers, get_int_list(a, "layers"));
    LOOM_ASSIGN_OR_RETURN(c.gqa.num_heads, get_int(a, "num_heads"));
    LOOM_ASSIGN_OR_RETURN(c.gqa.num_kv_heads, get_int_or(a, "num_kv_heads", c.gqa.num_heads));
    if (c.gqa.num_heads <= 0 || c.hidden_size % c.gqa.num_heads != 0)
      return absl::InvalidArgumentError("attn.num_heads must divide hidden_size");
    c.gqa.head_dim = c.hidden_size / c.gqa.num_heads;
    LOOM_RETURN_IF_ERROR(adapter::reject_true(a, "qkv_bias", "kda attention"));
    LOOM_RETURN_IF_ERROR(adapter::reject_true(a, "qk_norm", "kda attention"));
    if (auto w = a.find("window_size"); w != a.end() && !w->is_null())
      return absl::InvalidArgumentError("attn.window_size is not supported (must be null)");
    LOOM_ASSIGN_OR_RETURN(double theta, get_number_or(a, "rope_theta", 10000.0));
    c.rope.type = RopeConfig::Type::kDefault;
    c.rope.theta = theta;
    c.rope.partial_rotary_factor = 1.0;
    c.rope.interleaved = false;
  }
  for (int i = 0; i < c.num_layers; ++i) c.mixers.push_back(MixerType::kKda);
  for (int l : attn_layers) {
    if (l < 0 || l >= c.num_layers)
      return absl::InvalidArgumentError(
          absl::StrCat("attn.layers: layer ", l, " outside [0, ", c.num_layers, ") (0-indexed)"));
    if (c.mixers[l] == MixerType::kGqa)
      return absl::InvalidArgumentError(absl::StrCat("attn.layers lists layer ", l, " twice"));
    c.mixers[l] = MixerType::kGqa;
  }
  c.ffns.assign(c.num_layers, FfnType::kDense);
  LOOM_ASSIGN_OR_RETURN(c.attnres_block_size, get_int_or(j, "attnres_block_size", 0));
  if (c.attnres_block_size < 0)
    return absl::InvalidArgumentError("field 'attnres_block_size' must be >= 0");
  return c;
}

absl::StatusOr<TensorSource> fla_kda_tensor_source(const ModelConfig& cfg,
                                                   std::string_view canonical) {
  using adapter::single;
  if (canonical == "embed.weight") return single("model.embeddings.weight");
  if (canonical == "final_norm.weight") return single("model.norm.weight");
  if (canonical == "final_res_proj.weight") return single("model.res_proj.weight");
  if (canonical == "final_res_norm.weight") return single("model.res_norm.weight");
  if (canonical == "lm_head.weight")
    return single(cfg.tie_word_embeddings ? "model.embeddings.weight" : "lm_head.weight");
  int l = 0;
  std::string_view rest;
  if (!adapter::split_layer(canonical, &l, &rest)) return adapter::not_found("kda", canonical);
  const std::string p = absl::StrCat("model.layers.", l, ".");
  static const std::vector<std::pair<std::string_view, std::string_view>> kTable = {
      {"mixer_norm.weight", "attn_norm.weight"},
      {"ffn_norm.weight", "mlp_norm.weight"},
      {"mixer_res_proj.weight", "attn_res_proj.weight"},
      {"mixer_res_norm.weight", "attn_res_norm.weight"},
      {"ffn_res_proj.weight", "mlp_res_proj.weight"},
      {"ffn_res_norm.weight", "mlp_res_norm.weight"},
      {"kda.f_a.weight", "attn.f_proj.0.weight"},
      {"kda.f_b.weight", "attn.f_proj.1.weight"},
      {"kda.dt_bias", "attn.dt_bias"},
      {"kda.A_log", "attn.A_log"},
      {"kda.b_proj.weight", "attn.b_proj.weight"},
      {"kda.g_a.weight", "attn.g_proj.0.weight"},
      {"kda.g_b.weight", "attn.g_proj.1.weight"},
      {"kda.g_b.bias", "attn.g_proj.1.bias"},
      {"kda.o_norm.weight", "attn.o_norm.weight"},
      {"kda.o_proj.weight", "attn.o_proj.weight"},
      {"gqa.q_proj.weight", "attn.q_proj.weight"},
      {"gqa.k_proj.weight", "attn.k_proj.weight"},
      {"gqa.v_proj.weight", "attn.v_proj.weight"},
      {"gqa.o_proj.weight", "attn.o_proj.weight"},
      {"mlp.gate_proj.weight", "mlp.gate_proj.weight"},
      {"mlp.up_proj.weight", "mlp.up_proj.weight"},
      {"mlp.down_proj.weight", "mlp.down_proj.weight"},
  };
  TensorSource src;
  if (adapter::lookup(rest, kTable, p, &src)) return src;
  const std::string a = p + "attn.";
  if (rest == "kda.qkv_proj.weight")
    return adapter::concat({a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"});
  if (rest == "kda.conv.weight")
    return adapter::concat({a + "q_conv1d.weight", a + "k_conv1d.weight", a + "v_conv1d.weight"});
  return adapter::not_found("kda", canonical);
}

}  // namespace loom
