#include "engine/device_memory_plan.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status.h"
#include "core/workspace.h"
#include "engine/engine.h"
#include "engine/model/cache_store.h"
#include "engine/model/step_data.h"
#include "kernels/exec.h"

namespace loom {
namespace {

// Device memory the plan leaves for what it does not measure: cuBLAS and cuBLASLt workspaces,
// the step data's mirror, CUDA's own allocations made lazily at the first launches.
constexpr int64_t kSlackBytes = int64_t{256} << 20;

double gib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 30); }

}  // namespace

std::string DeviceMemoryPlan::describe() const {
  return absl::StrFormat(
      "device memory %.2f GiB, this engine's share %.2f GiB (utilization %.2f): weights %.2f "
      "GiB, step workspace %.2f GiB (a %d-token prefill needs %.2f GiB, plus the logits rows), "
      "sampler %.2f GiB, slack %.2f GiB; KV pages and state slots get %.2f GiB (%.2f GiB was "
      "free)",
      gib(total_bytes), gib(share_bytes), utilization, gib(weights_bytes), gib(workspace_bytes),
      profile_tokens, gib(profile_bytes), gib(sampler_bytes), gib(slack_bytes),
      gib(cache_budget_bytes), gib(free_bytes));
}

absl::StatusOr<int64_t> profile_step_memory(const Model& model, int64_t tokens, int64_t page_size,
                                            bool batch_invariant, std::optional<DType> kv_dtype) {
  if (tokens <= 0 || page_size <= 0)
    return absl::InvalidArgumentError("profile_step_memory: no tokens or no page size");
  const ModelConfig& cfg = model.config();
  const int64_t pages = (tokens + page_size - 1) / page_size;
  // Page and slot 0 are the engine's scratch; the sequence takes the ones after them.
  CacheStore::Options o;
  o.num_pages = pages + 1;
  o.page_size = page_size;
  o.num_slots = 2;
  o.device = model.device();
  o.kv_dtype = kv_dtype.value_or(model.act_dtype());
  o.act_dtype = model.act_dtype();
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<CacheStore> store, CacheStore::create(cfg, o));
  std::vector<int32_t> page_ids(pages);
  std::iota(page_ids.begin(), page_ids.end(), 1);
  Workspace ws(model.device());
  StepData step(model.device());
  ForwardBatch b;
  b.token_ids.resize(tokens);
  for (int64_t i = 0; i < tokens; ++i) b.token_ids[i] = static_cast<int32_t>(i % cfg.vocab_size);
  b.seqs.push_back({.num_tokens = tokens,
                    .logits = LogitsMode::kLast,
                    .start = 0,
                    .slot = store->has_linear() ? 1 : -1,
                    .pages = store->has_attention() ? std::span<const int32_t>(page_ids)
                                                    : std::span<const int32_t>()});
  b.store = store.get();
  b.batch_invariant = batch_invariant;
  b.workspace = &ws;
  b.step = &step;
  LOOM_ASSIGN_OR_RETURN(const Tensor logits, model.forward(b));
  float first = 0;  // waits for the step: every temporary was taken by then
  download(exec_for(model.device()), &first, logits.raw(), sizeof(float));
  return static_cast<int64_t>(ws.high_water());
}

absl::StatusOr<DeviceMemoryPlan> plan_device_memory(const Model& model,
                                                    const EngineOptions& options,
                                                    BatchSampler& sampler) {
  const Device device = model.device();
  if (device.is_cpu())
    return absl::InvalidArgumentError(
        "a cache budget of 0 (derive it from free device memory) needs a GPU: give the budget "
        "in bytes on the CPU (--cache_budget_mb)");
  if (!(options.gpu_memory_utilization > 0.0 && options.gpu_memory_utilization <= 1.0))
    return absl::InvalidArgumentError(
        absl::StrFormat("gpu_memory_utilization %g: expected a fraction in (0, 1]",
                        options.gpu_memory_utilization));
  const ModelConfig& cfg = model.config();
  DeviceMemoryPlan p;
  p.utilization = options.gpu_memory_utilization;
  p.weights_bytes = static_cast<int64_t>(model.parameters().bytes());
  p.profile_tokens = options.max_num_batched_tokens;
  LOOM_ASSIGN_OR_RETURN(p.profile_bytes,
                        profile_step_memory(model, p.profile_tokens, options.page_size,
                                            options.deterministic, options.kv_dtype));
  // The profile asked for one logits row; a step may ask for one per sequence (and gathers the
  // rows' hidden states first).
  const int64_t rows = options.max_num_seqs;
  p.workspace_bytes = p.profile_bytes + rows * (cfg.vocab_size + cfg.hidden_size) *
                                            static_cast<int64_t>(sizeof(float));
  p.sampler_bytes = static_cast<int64_t>(sampler.reserve(options.max_num_seqs, cfg.vocab_size));
  LOOM_ASSIGN_OR_RETURN(const DeviceMemory mem, device_memory(device));
  p.total_bytes = static_cast<int64_t>(mem.total_bytes);
  p.free_bytes = static_cast<int64_t>(mem.free_bytes);
  p.share_bytes = static_cast<int64_t>(p.utilization * p.total_bytes);
  p.slack_bytes = kSlackBytes;
  // The share, less what this engine holds besides the pools; and never more than is free (the
  // workspace is allocated after this, from the same free memory).
  p.cache_budget_bytes =
      std::min(p.share_bytes - p.weights_bytes - p.workspace_bytes - p.sampler_bytes,
               p.free_bytes - p.workspace_bytes) -
      p.slack_bytes;
  if (p.cache_budget_bytes <= 0)
    return absl::ResourceExhaustedError(absl::StrCat(
        "no device memory left for the KV cache and state slots: ", p.describe(),
        " (lower max_num_batched_tokens or max_num_seqs, or raise gpu_memory_utilization)"));
  return p;
}

}  // namespace loom
