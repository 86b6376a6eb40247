// ModelRunner: turns a scheduler BatchPlan into one Model::forward over the CacheStore, including
// the state-slot bookkeeping the plan asks for (reset, restore from a prefix-cache checkpoint,
// save a checkpoint after the step).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "core/workspace.h"
#include "engine/decode_graphs.h"
#include "engine/model/cache_store.h"
#include "engine/model/model.h"
#include "engine/model/step_data.h"
#include "engine/step_clock.h"
#include "scheduler/batch_plan.h"

namespace loom {

// Owned by the engine loop thread.
class ModelRunner {
 public:
  // `batch_invariant`: run every step in batch-invariant numerics (EngineOptions::deterministic).
  // The store must be on the model's device; the runner's workspace and step data live there too.
  // `workspace_bytes`: step memory to allocate now (a derived memory plan's), instead of growing
  // to the largest step's size when it first comes.
  ModelRunner(const Model& model, CacheStore& store, bool batch_invariant,
              size_t workspace_bytes = 0);

  // Runs `plan`; returns logits [k, V] for the k entries with sample == true, in plan order, on
  // the model's device: a view into the runner's workspace, valid until the next run(), which the
  // caller may use as scratch (the BatchSampler does). On a GPU nothing is read back here: the
  // sampler's kernels follow the step on the device's stream and download only the tokens.
  // `tape`, when set, gets what the forward records for it (the engine passes one wanting only
  // "expert_ids" when a planned request asked for its routing); such a step runs without a
  // decode graph.
  absl::StatusOr<Tensor> run(const BatchPlan& plan, ActivationTape* tape = nullptr);

  // Expert parallelism: a forward of one filler token in the scratch slot and page (no logits),
  // for a rank with nothing to run while the others step, so that it issues the step's
  // collectives too (the caller marks the step a dummy one for the MoE dispatchers).
  absl::Status run_dummy();

  // Sizes the step data for the largest step (the engine's limits), so that no step grows it.
  void reserve(const StepShape& largest) { step_.reserve(largest); }

  // From now on decode steps run as CUDA graphs (engine/decode_graphs.h), up to `largest`'s
  // sequences (and tokens) and page-table width; records every batch-size bucket now. Call after
  // reserve(largest). InvalidArgument on a device without graphs; a recording's error otherwise.
  absl::StatusOr<GraphCaptureReport> enable_decode_graphs(const StepShape& largest);
  // Null unless enabled: replays and recordings so far (tests, benchmarks).
  const DecodeGraphs* decode_graphs() const { return graphs_.get(); }

  // From now on every run() and run_dummy() marks its first device work on `clock` (null: stop),
  // which must outlive the runner or the next call.
  void set_step_clock(DeviceStepClock* clock);

  // The step memory every run() reuses: once both have seen the largest step, a step allocates
  // nothing and packs its step data once (tests count both).
  const Workspace& workspace() const { return workspace_; }
  const StepData& step_data() const { return step_; }

 private:
  // batch_ pointed at this runner's store, workspace and step data, for a new step.
  ForwardBatch& next_batch();

  const Model& model_;
  CacheStore& store_;
  const bool batch_invariant_;
  Workspace workspace_;
  StepData step_;
  ForwardBatch batch_;  // reused so its vectors keep their capacity from step to step
  std::unique_ptr<DecodeGraphs> graphs_;
  DeviceStepClock* clock_ = nullptr;
};

}  // namespace loom
