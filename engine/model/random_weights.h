// Random weights for any config.json (`--random_weights SEED`): a production-shaped model without
// a download. The model is built by Model::load's own layout from a generated WeightLoader
// (weights/weight_loader.h), so its parameters have exactly the names, shapes and dtypes a
// checkpoint of that config would load into; each tensor is filled where it lives by
// kernels/random_fill.h (on a GPU by a kernel, nothing staged on the host), from a counter-based
// hash of (seed, tensor name, element index): the same bits on the CPU and on any GPU, whatever
// the expert placement or the order of loading.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "weights/model_config.h"
#include "weights/weight_loader.h"

namespace loom {

// The distribution of one parameter: uniform in (center - half_width, center + half_width), a
// constant when half_width is 0.
struct RandomInit {
  float center = 0.0f;
  float half_width = 0.0f;
};

// The values parameter `canonical` (whole shape `full`) is drawn from, chosen so that an untrained
// model of any depth runs a finite, non-degenerate forward:
//  - matrices (projections, experts, router, lm_head, MLA's kv_b_proj): variance 1 / fan_in
//    (fan_in = the last dimension), so each projection keeps its input's scale;
//  - the embedding: variance 1 (the first norm rescales it anyway); a tied one (which lm_head then
//    holds too: the same values, as a checkpoint's one tensor) the matrices' 1 / hidden;
//  - short convolutions: PyTorch's Conv1d default, +-1/sqrt(kernel width);
//  - norm weights 1 (0 where the config stores zero-centred weights, norm_weight_offset 1);
//    biases and the router's score bias 0; Block-AttnRes pseudo-queries 0 (uniform block
//    weights at the start, as the paper initialises them);
//  - A_log: log A with A log-uniform in [1, 16] (the KDA/GDN references draw A in [1, 16] or
//    [0, 16]); KDA's dt_bias: inverse softplus of dt in [1e-3, 0.1] (fla's range, here uniform in
//    the inverse-softplus domain); GDN's dt_bias 1 (Qwen3-Next's init).
// InvalidArgument for a parameter no rule covers (a new kind of parameter needs its own rule).
absl::StatusOr<RandomInit> random_init(const ModelConfig& cfg, std::string_view canonical,
                                       const Shape& full);

// The --random_weights value: a decimal integer in [0, 2^64); InvalidArgument naming the flag
// otherwise (empty, signs, spaces, hex, overflow).
absl::StatusOr<uint64_t> parse_random_weights_seed(std::string_view text);

// With --random_weights, --model names a config.json file or a directory holding one: the config,
// parsed (any supported family; errors name the file and the field).
absl::StatusOr<ModelConfig> load_random_weights_config(const std::string& path);
// The directory the rest of a --model path's files come from (tokenizer, chat template, UNTRAINED
// marker): the path itself when it is a directory, else the file's folder.
std::string random_weights_model_dir(const std::string& path);

// The generated loader Model::load_random builds the model from.
WeightLoader random_weight_loader(const ModelConfig& cfg, uint64_t seed);

}  // namespace loom
