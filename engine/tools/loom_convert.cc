// loom-convert: turns a checkpoint of any supported family into Loom's native format.
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "engine/model/native_export.h"

ABSL_FLAG(std::string, from, "", "source checkpoint directory (config.json + safetensors)");
ABSL_FLAG(std::string, to, "", "destination directory (created if needed)");
ABSL_FLAG(std::string, dtype, "auto",
          "stored dtype: auto (an FP8 source's FP8 matrices as they are, with their scales; "
          "everything else f32), f32, bf16 (floating tensors), or fp8 (every GEMM matrix e4m3 "
          "with a scale per 128x128 block: FP8 source tensors as they are, the rest quantized; "
          "everything else f32)");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Converts a kimi_linear, deepseek_v3, qwen3_next, kda or loom checkpoint to the native "
      "format.\nusage: loom-convert --from DIR --to DIR [--dtype auto|f32|bf16|fp8]");
  absl::ParseCommandLine(argc, argv);
  const std::string from = absl::GetFlag(FLAGS_from), to = absl::GetFlag(FLAGS_to);
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  if (from.empty() || to.empty()) {
    std::fprintf(stderr, "loom-convert: --from and --to are required (see --help)\n");
    return 2;
  }
  if (dtype != "auto" && dtype != "f32" && dtype != "bf16" && dtype != "fp8") {
    std::fprintf(stderr, "loom-convert: --dtype must be auto, f32, bf16 or fp8, got '%s'\n",
                 dtype.c_str());
    return 2;
  }
  loom::ExportOptions options;
  options.bf16 = dtype == "bf16";
  options.matrices = dtype == "fp8"    ? loom::WeightDType::kFP8
                     : dtype == "auto" ? loom::WeightDType::kAuto
                                       : loom::WeightDType::kF32;
  absl::Status st = loom::convert_to_native(from, to, options);
  if (!st.ok()) {
    std::fprintf(stderr, "loom-convert: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  std::printf("wrote %s/config.json and %s/model.safetensors\n", to.c_str(), to.c_str());
  return 0;
}
