#include "bench/offline/roofline.h"

#include <cmath>
#include <string_view>

#include "engine/model/cache_store.h"

namespace loom::bench {
namespace {

bool is_routed_expert(std::string_view name) {
  return name.find(".moe.experts.") != std::string_view::npos;
}

}  // namespace

ModelFootprint model_footprint(const Model& model, DType kv_dtype) {
  const ModelConfig& cfg = model.config();
  ModelFootprint f;
  f.num_experts = cfg.moe.num_experts;
  f.top_k = cfg.moe.top_k;
  int64_t expert_params_all = 0;  // routed experts' parameters, every expert of every layer
  for (const ParameterArena::Entry& e : model.parameters().entries()) {
    const int64_t bytes = static_cast<int64_t>(e.tensor.nbytes());
    const int64_t params = e.tensor.numel();
    if (e.name == "embed.weight") continue;  // a row per token is gathered
    if (is_routed_expert(e.name)) {
      // [owned experts, ...]: one expert's share.
      const int64_t owned = e.tensor.dim(0);
      f.expert_bytes_all_layers += bytes / owned;
      expert_params_all += params / owned;
      continue;
    }
    f.dense_bytes += bytes;
    f.active_params += params;
  }
  f.active_params += f.top_k * expert_params_all;
  f.state_bytes = static_cast<int64_t>(CacheStore::slot_bytes(cfg, model.act_dtype()));
  for (int64_t b : CacheStore::kv_bytes_per_token(cfg, kv_dtype)) f.kv_bytes_per_token += b;
  // Causal attention: each (query, key) pair costs QK^T and PV over the heads: 2 * heads * (qk
  // width + v width) FLOPs (MLA in its expanded form, the prefill's).
  for (MixerType m : cfg.mixers) {
    if (m == MixerType::kMla) {
      const MlaConfig& a = cfg.mla;
      f.attention_flops_per_token_pair +=
          2LL * a.num_heads * (a.qk_nope_head_dim + a.qk_rope_head_dim + a.v_head_dim);
    } else if (m == MixerType::kGqa) {
      f.attention_flops_per_token_pair += 2LL * cfg.gqa.num_heads * 2 * cfg.gqa.head_dim;
    }
  }
  return f;
}

double expected_experts_touched(int64_t num_experts, int64_t top_k, int64_t tokens) {
  if (num_experts <= 0 || top_k <= 0 || tokens <= 0) return 0;
  const double e = static_cast<double>(num_experts);
  return e * (1.0 - std::pow(1.0 - static_cast<double>(top_k) / e, static_cast<double>(tokens)));
}

double decode_step_bytes(const ModelFootprint& f, int64_t batch, int64_t context) {
  const double experts = expected_experts_touched(f.num_experts, f.top_k, batch);
  return static_cast<double>(f.dense_bytes) + experts * f.expert_bytes_all_layers +
         static_cast<double>(batch) *
             (2.0 * f.state_bytes + static_cast<double>(context) * f.kv_bytes_per_token);
}

double prefill_flops(const ModelFootprint& f, int64_t tokens) {
  const double t = static_cast<double>(tokens);
  return 2.0 * static_cast<double>(f.active_params) * t +
         static_cast<double>(f.attention_flops_per_token_pair) * t * t / 2.0;
}

}  // namespace loom::bench
