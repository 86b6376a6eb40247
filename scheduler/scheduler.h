// Scheduler: picks, each step, which requests run and how many tokens each (decodes first, then
// chunked prefill under a token budget), owns the KV page pool, the state slot pool and the prefix
// cache, and preempts (recompute) under memory pressure. It knows sizes and ids, never tensors.
//
// Thread-safety: none. The scheduler and everything it returns belong to the engine loop thread;
// other threads hand requests and cancellations to that thread through the engine's queue.
//
// Call sequence per step (engine loop): add()/cancel() for what arrived; plan = schedule();
// run the model on plan; complete(result). schedule() may not be called again before complete().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "scheduler/batch_plan.h"
#include "scheduler/id_pool.h"
#include "scheduler/parked_sequences.h"
#include "scheduler/prefix_cache.h"
#include "scheduler/sequence_offload.h"

namespace loom {

struct SchedulerConfig {
  int32_t max_num_batched_tokens = 8192;  // tokens fed per step, all sequences together
  int32_t max_num_seqs = 256;             // sequences per step
  int32_t page_size = 64;                 // tokens per KV page == prefix-cache block
  bool has_attention_layers = true;       // requests need KV pages
  bool has_linear_layers = true;          // requests need a state slot
  int32_t num_pages = 0;        // KV pool size (see cache_sizing.h); ignored without attention
  int32_t num_state_slots = 0;  // state buffer slots incl. scratch slot 0; ignored without linear
  bool enable_prefix_cache = true;
  // Linear-state checkpoints at every checkpoint_interval-th block boundary (and always at the end
  // of a prompt's last full block). Each one forces a prefill chunk to end there.
  int32_t checkpoint_interval = 8;
  BlockHashFn block_hash = nullptr;  // tests only; nullptr: block_hash_default
  // What sequences parked between the turns of a session may hold (SchedRequest::park_key).
  ParkingBudget parking;
  // Where parked sequences go instead of being evicted (sequence_offload.h); null: evicted. Must
  // outlive the scheduler.
  SequenceOffload* offload = nullptr;
  // Where the prefix cache's evicted pages and checkpoints go (prefix_cache.h), to be copied back
  // for a later hit instead of recomputed; null: dropped. A tier of its own (the cache owns its
  // keys); must outlive the scheduler. Ignored without the prefix cache.
  SequenceOffload* prefix_offload = nullptr;
};

struct SchedRequest {
  uint64_t id = 0;              // unique among live requests
  std::vector<int32_t> prompt;  // non-empty
  int32_t max_new_tokens = 1;   // >= 1; the scheduler finishes the request at this many outputs
  int32_t priority = 0;         // higher runs first; FCFS (add order) within a priority
  // Nonzero: a turn of a session. At admission the request continues from the sequence parked
  // under this key, if one is (its pages, and its state at exactly its num_computed; REQUIRES:
  // that sequence's tokens are the prompt's first ones, which the session's owner guarantees),
  // or from the one offloaded under it (SchedulerConfig::offload: copied back into pages and a
  // slot allocated for it); otherwise, or when the offloaded bytes are lost, it starts as any
  // request does (prefix cache, recompute). When it finishes, its pages
  // and slot are parked under the key instead of freed (FinishedRequest::parked), and its tokens
  // are returned. Preemption and cancel() free them as for any request.
  uint64_t park_key = 0;
};

// Read-only view of a live request, for the engine's metrics and for tests.
struct RequestView {
  uint64_t id;
  bool running;                     // holds pages / a slot
  std::span<const int32_t> tokens;  // prompt + outputs
  int32_t prompt_len;
  int32_t num_computed;  // tokens in cache
  std::span<const IdPool::Handle> pages;
  int32_t state_slot;    // -1 when none
  int32_t restore_slot;  // checkpoint share held for the in-flight step, or -1
  int32_t save_slot;     // checkpoint slot being written by the in-flight step
  int32_t num_preemptions;
};

class Scheduler {
 public:
  // Fails with InvalidArgument on an inconsistent config.
  static absl::StatusOr<std::unique_ptr<Scheduler>> create(const SchedulerConfig& config);
  ~Scheduler();

  // Queues a request. InvalidArgument: duplicate live id, empty prompt, max_new_tokens < 1, or a
  // request that could never fit (prompt + max_new_tokens needs more pages than the pool has, or
  // the model has linear layers and there is no state slot).
  absl::Status add(SchedRequest request);
  // Frees everything the request holds, whatever its state (waiting, running, preempted, in the
  // in-flight step). NotFound if it is not live. Its result in the next complete() is ignored.
  absl::Status cancel(uint64_t id);

  // Plans the next step. REQUIRES: the previous plan was complete()d.
  BatchPlan schedule();
  // Applies the engine's results for the last plan: advances positions, appends sampled tokens,
  // saves checkpoints and completed prompt blocks into the prefix cache, and frees finished
  // requests (engine-finished, and those that reached max_new_tokens). Validates the whole result
  // before changing anything: InvalidArgument if a result names a request not in the plan, a token
  // is missing/unexpected, or a scheduled live request has no result.
  absl::StatusOr<std::vector<FinishedRequest>> complete(const StepResult& result);

  int32_t num_waiting() const;
  int32_t num_running() const;
  bool has_unfinished() const { return num_waiting() + num_running() > 0; }

  const KvPagePool& kv_pool() const;
  const StateSlotPool& slot_pool() const;
  const PrefixCache* prefix_cache() const;  // null when prefix caching is off
  // Sequences parked between session turns; drop_parked() forgets one, resident or offloaded
  // (no-op when none is).
  const ParkedSequences& parked() const;
  void drop_parked(uint64_t park_key);
  // Forgets every cached prefix (pages and linear-state checkpoints) and every parked sequence
  // (counted as evictions) and every offloaded one: what they hold was computed by weights the
  // model no longer has.
  // FailedPrecondition while any request is live (its pages and slot hold the old weights' state).
  absl::Status invalidate_caches();
  const SchedulerConfig& config() const;
  void for_each_request(const std::function<void(const RequestView&)>& fn) const;

 private:
  Scheduler();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom
