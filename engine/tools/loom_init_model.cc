// loom-init-model: writes a native checkpoint with deterministic random weights for a config
// (the bundled untrained default model, and test models of any shape).
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "engine/model/model.h"
#include "engine/model/native_export.h"

ABSL_FLAG(std::string, config, "weights/default/config.json", "native config.json to instantiate");
ABSL_FLAG(std::string, out, "build/default-model", "output directory");
ABSL_FLAG(uint64_t, seed, 1, "weight seed: same seed, same weights");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Writes a native Loom checkpoint with deterministic random (untrained) weights.\n"
      "usage: loom-init-model --config FILE --out DIR [--seed N]");
  absl::ParseCommandLine(argc, argv);
  std::ifstream in(absl::GetFlag(FLAGS_config), std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "loom-init-model: cannot open %s\n", absl::GetFlag(FLAGS_config).c_str());
    return 1;
  }
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<loom::ModelConfig> cfg = loom::parse_model_config(text.str());
  if (!cfg.ok()) {
    std::fprintf(stderr, "loom-init-model: %s\n", std::string(cfg.status().message()).c_str());
    return 1;
  }
  loom::WeightLoader weights = loom::WeightLoader::synthetic(*cfg, absl::GetFlag(FLAGS_seed));
  loom::WeightLoader::Record record;
  weights.set_recorder(&record);
  absl::StatusOr<std::unique_ptr<loom::Model>> model = loom::Model::load(*cfg, weights);
  if (!model.ok()) {
    std::fprintf(stderr, "loom-init-model: %s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  const std::string out = absl::GetFlag(FLAGS_out);
  absl::Status st = loom::write_native_checkpoint(*cfg, record, out);
  if (!st.ok()) {
    std::fprintf(stderr, "loom-init-model: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  std::ofstream marker(out + "/UNTRAINED");
  marker << "Random weights from loom-init-model (seed " << absl::GetFlag(FLAGS_seed)
         << "): this model is untrained.\n";
  int64_t params = 0;
  for (const auto& [name, t] : record) params += t.numel();
  std::printf("wrote %s: %lld parameters, untrained\n", out.c_str(),
              static_cast<long long>(params));
  return 0;
}
