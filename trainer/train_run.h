// `loom-trainer train`: the training loop over a RunConfig. Each step draws a micro-batch (MQAR
// examples, passkeys with their answers scored, tool-use dialogues in the model family's chat
// format with the assistant turns scored, a weighted mix of those three, or windows of
// seq_len + 1 tokens drawn uniformly from the shards), runs TrainStep,
// appends a JSON line to RUN/metrics.jsonl and redraws a progress line (loss, tokens/s, ETA);
// checkpoints go to RUN/checkpoint-<step> every checkpoint_every steps and at the end. A run whose
// model is a trainer checkpoint resumes its optimizer state, data RNG and stage. Each metrics line
// has the step's loss_by_position; with stages (stages.h) also the stage and its seq_len, and a
// stage's RoPE base is set on the model as the stage starts (docs/trainer.md).
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/model.h"
#include "trainer/run_config.h"

namespace loom {

struct RunSummary {
  int64_t steps = 0;  // steps run by this call
  double first_loss = 0, last_loss = 0;
  std::string last_checkpoint;
};

// `progress`: where the progress line goes (stderr for the tool, null for none).
absl::StatusOr<RunSummary> run_training(const RunConfig& config, std::FILE* progress);

// The model of a config's "model" section, trainable: the checkpoint when one is named, else the
// model config's deterministic synthetic weights from `seed` (the same values on every device),
// f32 on `device`. `what` names the command in errors.
absl::StatusOr<std::unique_ptr<Model>> load_run_model(const std::string& checkpoint,
                                                      const std::string& config, uint64_t seed,
                                                      std::string_view what,
                                                      Device device = Device::kCpu);

}  // namespace loom
