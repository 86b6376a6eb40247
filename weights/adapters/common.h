// Helpers shared by the family adapters.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "weights/adapters/adapters.h"

namespace loom::adapter {

// Splits "layers.<i>.<rest>" into (i, rest); false for names outside a layer.
bool split_layer(std::string_view canonical, int* layer, std::string_view* rest);

TensorSource single(std::string name);
TensorSource concat(std::vector<std::string> names);
// Per-expert tensors `<prefix><e><suffix>` for e in [0, num_experts), stacked.
TensorSource stacked_experts(const std::string& prefix, int num_experts, std::string_view suffix);
// Looks `rest` up in a table of (canonical suffix, checkpoint suffix) pairs.
bool lookup(std::string_view rest,
            const std::vector<std::pair<std::string_view, std::string_view>>& table,
            const std::string& checkpoint_prefix, TensorSource* out);
absl::Status not_found(std::string_view family, std::string_view canonical);

// Rows [begin, end) of a 2-D weight, as a list of row ranges to gather in order.
using RowRanges = std::vector<std::pair<int64_t, int64_t>>;
// A transform gathering the given row ranges, in order, into a new tensor (regrouping or
// splitting fused projections).
std::function<absl::StatusOr<Tensor>(const Tensor&)> gather_rows_transform(RowRanges ranges);

// RoPE settings from `rope_parameters` (transformers 5) or the legacy `rope_scaling` +
// `rope_theta` fields. `default_partial` applies when no partial_rotary_factor is given.
absl::StatusOr<RopeConfig> parse_rope(const nlohmann::json& j, double default_theta,
                                      double default_partial);

// The fields every family has: vocab_size, hidden_size, num_hidden_layers (1..4096), the norm
// epsilon (`eps_key`), tie_word_embeddings, the context length (`max_pos_key`), bos/eos ids.
absl::Status parse_common_fields(const nlohmann::json& j, const char* eps_key, double eps_default,
                                 const char* max_pos_key, int max_pos_default, ModelConfig* c);
// `quantization_config` (DeepSeek-V3's block FP8) into ModelConfig::fp8_block_*; any other
// quantization is refused by name. Called by parse_common_fields.
absl::Status parse_quantization(const nlohmann::json& j, ModelConfig* c);

// Fails naming the field if `j[key]` is present and true ("<key> = true is not supported").
absl::Status reject_true(const nlohmann::json& j, const char* key, std::string_view family);
// The checkpoint's activation must be SiLU ("silu" or "swish").
absl::Status require_silu(const nlohmann::json& j, const char* key);

}  // namespace loom::adapter
