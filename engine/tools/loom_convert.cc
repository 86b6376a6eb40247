// loom-convert: turns a checkpoint of any supported family into Loom's native format.
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "engine/model/native_export.h"

ABSL_FLAG(std::string, from, "", "source checkpoint directory (config.json + safetensors)");
ABSL_FLAG(std::string, to, "", "destination directory (created if needed)");
ABSL_FLAG(std::string, dtype, "f32", "stored dtype of floating tensors: f32 or bf16");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Converts a kimi_linear, deepseek_v3, qwen3_next, kda or loom checkpoint to the native "
      "format.\nusage: loom-convert --from DIR --to DIR [--dtype f32|bf16]");
  absl::ParseCommandLine(argc, argv);
  const std::string from = absl::GetFlag(FLAGS_from), to = absl::GetFlag(FLAGS_to);
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  if (from.empty() || to.empty()) {
    std::fprintf(stderr, "loom-convert: --from and --to are required (see --help)\n");
    return 2;
  }
  if (dtype != "f32" && dtype != "bf16") {
    std::fprintf(stderr, "loom-convert: --dtype must be f32 or bf16, got '%s'\n", dtype.c_str());
    return 2;
  }
  loom::ExportOptions options;
  options.bf16 = dtype == "bf16";
  absl::Status st = loom::convert_to_native(from, to, options);
  if (!st.ok()) {
    std::fprintf(stderr, "loom-convert: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  std::printf("wrote %s/config.json and %s/model.safetensors\n", to.c_str(), to.c_str());
  return 0;
}
