// Writing checkpoints in Loom's native format (docs/native-format.md).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "weights/model_config.h"
#include "weights/weight_loader.h"

namespace loom {

struct ExportOptions {
  bool bf16 = false;  // store f32 tensors as bf16
  // How convert_to_native loads the matrices (Placement::dtype), so what it writes: kF32
  // dequantizes FP8 sources; kFP8 writes every GEMM matrix as e4m3 with its block scales (FP8
  // tensors of the source as they are, the rest quantized); kAuto keeps an FP8 source's FP8
  // matrices as they are (the rest of that source in its own precision) and loads anything else
  // as kF32 does.
  WeightDType matrices = WeightDType::kF32;
};

// Writes DIR/config.json (model_type "loom") and DIR/model.safetensors holding `tensors` under
// their canonical names (a tied lm_head is not stored twice). A stored FP8 matrix X
// (core/fp8_matrix.h) is written as X (F8_E4M3) and X_scale_inv (F32 [.., ceil(N/128),
// ceil(K/128)]), and the config then gets a quantization_config of 128 x 128 blocks. Creates DIR
// if needed.
absl::Status write_native_checkpoint(const ModelConfig& cfg, const WeightLoader::Record& tensors,
                                     const std::string& dir, const ExportOptions& options = {});

// Converts a checkpoint of any supported family: loads it as a Model (which validates every
// tensor), then writes exactly the tensors the model loaded. Tokenizer and generation files found
// in `from` are copied along.
absl::Status convert_to_native(const std::string& from, const std::string& to,
                               const ExportOptions& options = {});

}  // namespace loom
