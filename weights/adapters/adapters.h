// Family adapters: config.json -> ModelConfig, and canonical tensor names -> checkpoint tensors.
// Canonical names are listed in docs/native-format.md.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
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
};

absl::StatusOr<ModelConfig> parse_kimi_linear_config(const nlohmann::json& j);
// NotFoundError when the family has no tensor for `canonical`.
absl::StatusOr<TensorSource> kimi_linear_tensor_source(const ModelConfig& cfg,
                                                       std::string_view canonical);

// Dispatches on cfg.model_type.
absl::StatusOr<TensorSource> tensor_source(const ModelConfig& cfg, std::string_view canonical);

}  // namespace loom
