// Training checkpoints: a folder the server loads as it is (native config.json and
// model.safetensors, plus the tokenizer files of the run) and the trainer's state beside them
// (trainer_state.safetensors: the step count and both AdamW moments of every parameter, with the
// data position and RNG state in its metadata), written atomically: everything goes to DIR.tmp
// first, which then replaces DIR in one rename.
#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model/model.h"
#include "trainer/train_step.h"

namespace loom {

// Free-form strings a run keeps with its state (data position, RNG state, run config).
using TrainerMetadata = std::map<std::string, std::string>;

// Writes the checkpoint of `model` (its parameters as they are now) and `step`'s optimizer state
// to `dir`, replacing any checkpoint there. Files named in `copy_files` (tokenizer, generation
// config) are copied along.
absl::Status save_checkpoint(const std::string& dir, const Model& model, const TrainStep& step,
                             const TrainerMetadata& metadata,
                             const std::vector<std::string>& copy_files = {});

// Reads the optimizer state of a checkpoint into `step` (built for the model loaded from the same
// folder with Placement::trainable) and returns its metadata.
absl::StatusOr<TrainerMetadata> load_trainer_state(const std::string& dir, TrainStep& step);

}  // namespace loom
