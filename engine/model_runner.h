// ModelRunner: turns a scheduler BatchPlan into one Model::forward over the CacheStore, including
// the state-slot bookkeeping the plan asks for (reset, restore from a prefix-cache checkpoint,
// save a checkpoint after the step).
#pragma once

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "engine/model/cache_store.h"
#include "engine/model/model.h"
#include "scheduler/batch_plan.h"

namespace loom {

// Owned by the engine loop thread.
class ModelRunner {
 public:
  // `batch_invariant`: run every step in batch-invariant numerics (EngineOptions::deterministic).
  ModelRunner(const Model& model, CacheStore& store, bool batch_invariant)
      : model_(model), store_(store), batch_invariant_(batch_invariant) {}

  // Runs `plan`; returns logits [k, V] for the k entries with sample == true, in plan order.
  absl::StatusOr<Tensor> run(const BatchPlan& plan);

 private:
  const Model& model_;
  CacheStore& store_;
  const bool batch_invariant_;
};

}  // namespace loom
