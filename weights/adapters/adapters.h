// Family adapters: config.json -> ModelConfig, and canonical tensor names -> checkpoint tensors.
// Canonical names are listed in docs/native-format.md.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "nlohmann/json.hpp"
#include "weights/model_config.h"

namespace loom {

// Where a canonical tensor lives in a family's checkpoint.
struct TensorSource {
  enum class Combine : uint8_t {
    kSingle,  // names[0] as is
    kStack,   // stack names along a new leading dimension (per-expert tensors)
    kConcat,  // concatenate names along dimension 0 (fused projections)
  };
  Combine combine = Combine::kSingle;
  std::vector<std::string> names;
  // Applied to the combined tensor (in the checkpoint's dtype; f32 for mixed or FP8 parts) before
  // its shape is checked (e.g. regrouping or splitting the rows of a fused projection into the
  // canonical layout).
  std::function<absl::StatusOr<Tensor>(const Tensor&)> transform;
};

absl::StatusOr<ModelConfig> parse_kimi_linear_config(const nlohmann::json& j);
// NotFoundError when the family has no tensor for `canonical`.
absl::StatusOr<TensorSource> kimi_linear_tensor_source(const ModelConfig& cfg,
                                                       std::string_view canonical);

absl::StatusOr<ModelConfig> parse_deepseek_v3_config(const nlohmann::json& j);
absl::StatusOr<TensorSource> deepseek_v3_tensor_source(const ModelConfig& cfg,
                                                       std::string_view canonical);
absl::StatusOr<ModelConfig> parse_qwen3_next_config(const nlohmann::json& j);
absl::StatusOr<TensorSource> qwen3_next_tensor_source(const ModelConfig& cfg,
                                                      std::string_view canonical);
absl::StatusOr<ModelConfig> parse_fla_kda_config(const nlohmann::json& j);
absl::StatusOr<TensorSource> fla_kda_tensor_source(const ModelConfig& cfg,
                                                   std::string_view canonical);
absl::StatusOr<ModelConfig> parse_loom_config(const nlohmann::json& j);
absl::StatusOr<TensorSource> loom_tensor_source(const ModelConfig& cfg, std::string_view canonical);
// The native config.json for `cfg` (parse_loom_config of it gives back the same model).
nlohmann::json native_config_json(const ModelConfig& cfg);

// Dispatches on cfg.model_type.
absl::StatusOr<TensorSource> tensor_source(const ModelConfig& cfg, std::string_view canonical);

}  // namespace loom
