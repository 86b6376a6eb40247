// How an engine on a GPU splits the device's memory when its cache budget is derived
// (EngineOptions::cache_budget_bytes == 0) rather than given: the weights are loaded, one prefill
// step of the largest token budget is run to measure the step memory it needs, and the sampler's
// scratch is allocated for the largest step; of gpu_memory_utilization x the device's memory
// (this engine's share, whatever other processes hold), what the weights, the step memory, the
// sampler and a slack for CUDA's own allocations leave goes to KV pages and state slots, capped by
// what the driver reports free. vLLM sizes its cache the same way (a profiling forward, then the
// engine's share); measuring beats estimating because the step memory depends on every kernel's
// temporaries.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model/model.h"
#include "engine/sampling/batch_sampler.h"

namespace loom {

struct EngineOptions;

struct DeviceMemoryPlan {
  int64_t total_bytes = 0;         // the device's memory
  int64_t weights_bytes = 0;       // the model's parameters
  int64_t profile_tokens = 0;      // tokens of the profiled prefill step
  int64_t profile_bytes = 0;       // the step memory that step needed (workspace high-water)
  int64_t workspace_bytes = 0;     // reserved for the runner: the profile plus every logits row
  int64_t sampler_bytes = 0;       // the sampler's scratch for the largest step
  int64_t free_bytes = 0;          // free once the weights and the sampler are resident
  int64_t share_bytes = 0;         // utilization x total: what this engine may hold in all
  int64_t slack_bytes = 0;         // left for cuBLAS workspaces, the step data, CUDA's own
  int64_t cache_budget_bytes = 0;  // for KV pages and state slots
  double utilization = 0;

  // One line for start-up logs: every figure above in GiB.
  std::string describe() const;
};

// The step memory (bytes of workspace high-water) of one prefill of `tokens` tokens from position
// 0, as the engine would run it (its page size, deterministic numerics or not, its KV page dtype:
// unset, the activation dtype), in a private store, so that it runs the attention kernels the
// engine will run over its pages.
absl::StatusOr<int64_t> profile_step_memory(const Model& model, int64_t tokens, int64_t page_size,
                                            bool batch_invariant,
                                            std::optional<DType> kv_dtype = std::nullopt);

// The plan for `model` (loaded on a GPU) under `options`; reserves `sampler`'s scratch for
// options.max_num_seqs rows. InvalidArgument on the host or for a utilization outside (0, 1];
// ResourceExhausted, with the figures, when nothing is left for the cache.
absl::StatusOr<DeviceMemoryPlan> plan_device_memory(const Model& model,
                                                    const EngineOptions& options,
                                                    BatchSampler& sampler);

}  // namespace loom
