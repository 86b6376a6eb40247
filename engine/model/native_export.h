// Writing checkpoints in Loom's native format (docs/native-format.md).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "weights/model_config.h"
#include "weights/weight_loader.h"

namespace loom {

struct ExportOptions {
  bool bf16 = false;  // store floating tensors as bf16 instead of f32
};

// Writes DIR/config.json (model_type "loom") and DIR/model.safetensors holding `tensors` under
// their canonical names (a tied lm_head is not stored twice). Creates DIR if needed.
absl::Status write_native_checkpoint(const ModelConfig& cfg, const WeightLoader::Record& tensors,
                                     const std::string& dir, const ExportOptions& options = {});

// Converts a checkpoint of any supported family: loads it as a Model (which validates every
// tensor), then writes exactly the tensors the model loaded. Tokenizer and generation files found
// in `from` are copied along.
absl::Status convert_to_native(const std::string& from, const std::string& to,
                               const ExportOptions& options = {});

}  // namespace loom
