// Family dispatch: config.json parsing and tensor-name mapping by model_type.
#include "absl/strings/str_cat.h"
#include "weights/adapters/adapters.h"

namespace loom {

absl::StatusOr<TensorSource> tensor_source(const ModelConfig& cfg, std::string_view canonical) {
  if (cfg.model_type == "kimi_linear") return kimi_linear_tensor_source(cfg, canonical);
  if (cfg.model_type == "deepseek_v3") return deepseek_v3_tensor_source(cfg, canonical);
  if (cfg.model_type == "qwen3_next") return qwen3_next_tensor_source(cfg, canonical);
  if (cfg.model_type == "kda") return fla_kda_tensor_source(cfg, canonical);
  if (cfg.model_type == "loom") return loom_tensor_source(cfg, canonical);
  return absl::InvalidArgumentError(
      absl::StrCat("no tensor adapter for model_type '", cfg.model_type, "'"));
}

}  // namespace loom
