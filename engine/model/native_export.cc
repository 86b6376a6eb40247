#include "engine/model/native_export.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "core/fp8_matrix.h"
#include "core/status.h"
#include "engine/model/model.h"
#include "weights/adapters/adapters.h"
#include "weights/safetensors.h"

namespace loom {

absl::Status write_native_checkpoint(const ModelConfig& cfg, const WeightLoader::Record& tensors,
                                     const std::string& dir, const ExportOptions& options) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  std::vector<std::pair<std::string, Tensor>> out;
  bool fp8 = false;
  for (const auto& [name, t] : tensors) {
    if (name == "lm_head.weight" && cfg.tie_word_embeddings) continue;
    bool duplicate = false;
    for (const auto& [n, _] : out) duplicate |= n == name;
    if (duplicate) continue;
    if (t.dtype() == DType::kF8E4M3) {
      // The stored pair, as DeepSeek-V3 names it: X and X_scale_inv.
      out.emplace_back(name, t);
      out.emplace_back(name + "_scale_inv", fp8_matrix_scales(t));
      fp8 = true;
    } else if (options.bf16 && t.dtype() == DType::kF32) {
      Tensor b = Tensor::empty(t.shape(), DType::kBF16);
      const Tensor src = t.is_contiguous() ? t : t.clone();
      for (int64_t i = 0; i < t.numel(); ++i)
        b.data<uint16_t>()[i] = f32_to_bf16(src.data<float>()[i]);
      out.emplace_back(name, b);
    } else {
      out.emplace_back(name, t);
    }
  }
  ModelConfig native = cfg;
  native.model_type = "loom";
  // FP8 tensors written are in Loom's 128 x 128 blocks; without any, nothing is quantized.
  native.fp8_block_rows = native.fp8_block_cols = fp8 ? static_cast<int>(kFp8BlockSize) : 0;
  LOOM_RETURN_IF_ERROR(
      write_safetensors(dir + "/model.safetensors", out, {{"format", "pt"}, {"loom_format", "1"}}));
  const std::string cfg_path = dir + "/config.json";
  std::ofstream f(cfg_path, std::ios::binary | std::ios::trunc);
  f << native_config_json(native).dump(2) << "\n";
  f.close();
  if (!f) return absl::InternalError(absl::StrCat("cannot write ", cfg_path));
  return absl::OkStatus();
}

absl::Status convert_to_native(const std::string& from, const std::string& to,
                               const ExportOptions& options) {
  std::error_code same_ec;
  if (std::filesystem::equivalent(from, to, same_ec))
    return absl::InvalidArgumentError("the source and destination are the same directory");
  LOOM_ASSIGN_OR_RETURN(ModelConfig cfg, load_model_config(from));
  LOOM_ASSIGN_OR_RETURN(WeightLoader loader, WeightLoader::open(from, cfg));
  WeightLoader::Record record;
  loader.set_recorder(&record);
  // kAuto keeps FP8 matrices only for an FP8 source; any other loads as f32, as it always did.
  const WeightDType matrices = options.matrices == WeightDType::kAuto && cfg.fp8_block_rows == 0
                                   ? WeightDType::kF32
                                   : options.matrices;
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                        Model::load(cfg, loader, Placement{.dtype = matrices}));
  LOOM_RETURN_IF_ERROR(write_native_checkpoint(cfg, record, to, options));
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "generation_config.json",
                           "special_tokens_map.json"}) {
    const std::filesystem::path src = std::filesystem::path(from) / name;
    if (!std::filesystem::exists(src)) continue;
    std::error_code ec;
    std::filesystem::copy_file(src, std::filesystem::path(to) / name,
                               std::filesystem::copy_options::overwrite_existing, ec);
    if (ec)
      return absl::InternalError(absl::StrCat("cannot copy ", src.string(), ": ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace loom
