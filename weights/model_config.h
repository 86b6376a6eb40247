// ModelConfig: the family-neutral description of a model that everything past the family adapter
// uses. Family adapters (weights/adapters/) fill it from a checkpoint's config.json.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace loom {

enum class MixerType : uint8_t { kKda, kGdn, kMla, kGqa };
enum class FfnType : uint8_t { kDense, kMoe };
std::string_view mixer_type_name(MixerType t);

// Kimi Delta Attention and Gated DeltaNet layers.
struct LinearAttentionConfig {
  int num_heads = 0;    // key heads (KDA: the only head count)
  int num_v_heads = 0;  // value heads (GDN may have more value than key heads; KDA: = num_heads)
  int head_dim = 0;     // d_k
  int v_head_dim = 0;   // d_v
  int conv_kernel = 4;  // short convolution width W
  int gate_rank = 0;    // KDA: inner width of the low-rank f (decay) and g (output gate)
                        // projections (kimi_linear: head_dim; fla: head_v_dim)
  float gate_lower_bound = 0.0f;  // 0: softplus gate; < 0: bounded gate lb * sigmoid(.)
  bool output_gate_bias = false;  // KDA's g_b projection has a bias (fla)
};

struct RopeConfig {
  enum class Type : uint8_t { kNone, kDefault, kYarn };
  Type type = Type::kNone;
  double theta = 10000.0;
  bool interleaved = false;  // pairs (2i, 2i+1) (deepseek) vs halves (rotate_half)
  double partial_rotary_factor = 1.0;
  // YaRN
  double factor = 1.0;
  double original_max_position = 0;
  double beta_fast = 32, beta_slow = 1;
  double mscale = 0.0, mscale_all_dim = 0.0;  // 0: unset
  double attention_factor = -1.0;             // < 0: derived from factor and mscales
  bool truncate = true;
};

struct MlaConfig {
  int num_heads = 0;
  int q_lora_rank = 0;  // 0: plain q_proj
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  bool output_gate = false;  // native gated MLA
};

struct GqaConfig {
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  bool qk_norm = false;      // qwen3_next per-head q/k RMSNorm
  bool output_gate = false;  // qwen3_next: q_proj also yields a sigmoid gate per head
};

struct MoeConfig {
  int num_experts = 0;
  int top_k = 0;
  int intermediate_size = 0;
  int num_shared_experts = 0;
  int shared_intermediate_size = 0;  // total width of the shared expert MLP
  bool shared_expert_gate = false;   // qwen3_next: sigmoid(shared_expert_gate(x)) scales it
  bool score_sigmoid = true;         // false: softmax router
  bool has_score_bias = false;       // e_score_correction_bias
  int n_group = 1;
  int topk_group = 1;
  bool renormalize = true;
  float routed_scaling = 1.0f;
};

struct ModelConfig {
  std::string model_type;  // the checkpoint's family ("kimi_linear", ...)
  int vocab_size = 0;
  int hidden_size = 0;
  int num_layers = 0;
  int intermediate_size = 0;  // dense MLP width
  float rms_norm_eps = 1e-6f;
  float norm_weight_offset = 0.0f;  // 1 for zero-centred RMSNorm weights (qwen3_next)
  bool tie_word_embeddings = false;
  int max_position_embeddings = 0;
  int bos_token_id = -1;
  int eos_token_id = -1;

  std::vector<MixerType> mixers;  // per layer
  std::vector<FfnType> ffns;      // per layer

  LinearAttentionConfig linear;
  MlaConfig mla;
  GqaConfig gqa;
  RopeConfig rope;
  MoeConfig moe;
  int attnres_block_size = 0;  // 0: plain residuals

  // Block-quantized FP8 weights (DeepSeek-V3's `quantization_config`, quant_method "fp8"): each FP8
  // tensor X.weight comes with X.weight_scale_inv, one f32 scale per block of fp8_block_rows x
  // fp8_block_cols elements; the loader dequantizes them (weights/fp8.h). 0: no FP8 weights.
  int fp8_block_rows = 0, fp8_block_cols = 0;

  // Quantile load balancing of the router bias (training only; MODELS.md "Mixture of Experts").
  struct Balance {
    bool enabled = false;
    double q_low = 0.25, q_high = 0.75, eta = 1e-3;
  } balance;

  // Checks internal consistency (sizes positive, per-layer lists of num_layers entries, ...).
  absl::Status validate() const;
};

// Parses a config.json text of any supported family. Errors name the field and what was expected.
absl::StatusOr<ModelConfig> parse_model_config(std::string_view json_text);
// Reads and parses DIR/config.json.
absl::StatusOr<ModelConfig> load_model_config(const std::string& dir);

}  // namespace loom
