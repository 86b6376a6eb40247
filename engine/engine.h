// Engine: a model served to many concurrent requests. One loop thread admits requests, asks the
// scheduler for a batch plan, runs one model step, samples, streams outputs and finishes
// requests. submit() and cancel() may be called from any thread; outputs are pulled from each
// request's RequestStream, so no user code ever runs on the loop thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/decode_graphs.h"
#include "engine/device_memory_plan.h"
#include "engine/model/model.h"
#include "engine/request.h"
#include "engine/request_stream.h"
#include "engine/step_clock.h"
#include "engine/tokenizer/tokenizer.h"

namespace loom {

class EngineInbox;
class EngineLoop;
struct EngineRankLink;
class ExpertParallelRanks;
class SessionStore;

struct EngineOptions {
  // KV pages + linear-state slots. 0: on a GPU, derived from the memory left once the weights, a
  // profiled largest step and the sampler are resident (engine/device_memory_plan.h).
  int64_t cache_budget_bytes = int64_t{1} << 30;
  // With a derived budget: the fraction of the device's memory the engine may fill (weights,
  // step memory, sampler and caches together); the rest is left to other processes and CUDA.
  double gpu_memory_utilization = 0.9;
  int32_t max_num_batched_tokens = 2048;  // tokens per step over all sequences
  int32_t max_num_seqs = 64;              // sequences per step (and live state slots)
  int32_t page_size = 64;                 // tokens per KV page / prefix-cache block
  bool enable_prefix_cache = true;
  int32_t checkpoint_interval = 8;  // linear-state checkpoints every N blocks (prefix cache)
  int32_t max_model_len = 0;        // prompt + max_tokens limit; 0: the model's
                                    // max_position_embeddings (or unlimited when it has none)
  uint64_t seed = 0;                // seeds requests that bring none (0: random)
  int32_t max_n = kMaxN;            // choices per request (each prefills and decodes on its own)
  // Batch-invariant numerics (kernels/batch_invariance.h): a request's tokens and logprobs are
  // bit-identical whatever else runs, however its prompt is chunked, and across prefix-cache hits
  // and preemption. Slower; docs/operations.md has the cost.
  bool deterministic = false;
  // Storage dtype of the attention KV pages (CacheStore::Options::kv_dtype): f32, bf16 or
  // kF8E4M3 (fp8: e4m3 with one f32 scale per cached vector; parse_kv_dtype); unset:
  // the model's activation dtype (Model::act_dtype(): a bf16 activation is stored as it is).
  // Cache sizing counts its bytes; Engine::create refuses a dtype the model's device cannot read
  // with CacheStore::validate's message.
  std::optional<DType> kv_dtype;
  // Decode steps replayed as CUDA graphs, one per batch-size bucket (engine/decode_graphs.h),
  // recorded at start-up; ignored on the CPU. Off: every step launches its kernels one by one.
  bool cuda_graphs = true;
  // Sessions (Request::session, engine/session_store.h). Live sessions at most; a new one past
  // this is refused.
  int32_t max_sessions = 1024;
  // A session idle this long is dropped (its history and kept cache).
  double session_ttl_s = 3600;
  // Cache (KV pages + state slot) one session may keep between turns; 0: no limit but the cache.
  // A session over it keeps only its token history, and its next turn is recomputed.
  int64_t session_max_bytes = 0;
  // Cache all sessions together may keep between turns; 0: no limit but the cache. Past it, and
  // whenever running requests need the memory, the least recently used session's cache moves to
  // the offload tier (session_offload_bytes; one larger than this budget at once), or without
  // room there is evicted (its next turn is recomputed from its history).
  int64_t sessions_max_bytes = 0;
  // Host memory that kept session caches move to (engine/session_offload.h) instead of being
  // evicted, when the device pools need room or sessions_max_bytes is reached, and come back
  // from, copied, when the session's next turn arrives; 0: off (evicted, then recomputed). Held
  // per offloaded cache, not reserved. Past it the least recently offloaded move to
  // session_offload_dir (non-empty: a directory the engine creates if needed and must be able to
  // write; at most session_offload_disk_bytes there, 0: no limit but the disk), or are evicted.
  int64_t session_offload_bytes = int64_t{4} << 30;
  std::string session_offload_dir;
  int64_t session_offload_disk_bytes = 0;
  // Host memory the prefix cache's evicted pages and linear-state checkpoints move to (a tier of
  // its own, host memory only, held per blob), copied back for a later request that shares the
  // prefix instead of recomputing it; 0: off (evicted blocks are dropped). Past it the least
  // recently evicted are dropped (recomputed if needed again). Ignored without the prefix cache.
  int64_t prefix_offload_bytes = int64_t{1} << 30;
};

struct EngineStats {
  int32_t waiting = 0, running = 0;
  int32_t pages_total = 0, pages_free = 0;
  int32_t slots_total = 0, slots_free = 0;
  int64_t steps = 0, prompt_tokens = 0, generated_tokens = 0, preemptions = 0;
  int64_t prefix_hit_tokens = 0, prefix_query_tokens = 0;
  int64_t finished_stop = 0, finished_length = 0, finished_cancelled = 0, finished_error = 0;
  // Sessions: live ones and their token histories; those whose end-of-turn cache is kept, what
  // that cache holds (pages shared with the prefix cache counted in full); evictions of kept
  // caches (budget or memory pressure) and sessions dropped by the ttl, since start.
  int32_t sessions = 0, sessions_resident = 0;
  int64_t session_history_tokens = 0;
  int32_t session_pages = 0, session_slots = 0;
  int64_t session_bytes = 0;
  // session_evictions: kept caches lost (the next turn recomputes): evicted from the device
  // without offload, or dropped by the offload tier's budgets or found corrupt there.
  int64_t session_evictions = 0, sessions_expired = 0;
  // The offload tier (EngineOptions::session_offload_bytes): sessions whose cache is in host
  // memory and on disk, and their bytes; since start, caches moved there (session_offloads),
  // copied back for a turn (session_restores), and lost there (session_offload_lost: budgets,
  // failed writes, missing or corrupt files; counted in session_evictions too).
  int32_t sessions_offloaded = 0, sessions_on_disk = 0;
  int64_t session_offload_bytes = 0, session_offload_disk_bytes = 0;
  int64_t session_offloads = 0, session_restores = 0, session_offload_lost = 0;
  // The prefix cache's offload tier (EngineOptions::prefix_offload_bytes): its host bytes; since
  // start, pages and checkpoints moved there, admissions that copied blocks back (hits), the pages
  // and checkpoints copied back (each one not recomputed), and those dropped by its budget.
  int64_t prefix_offload_bytes = 0, prefix_offloads = 0, prefix_offload_hits = 0;
  int64_t prefix_restored_pages = 0, prefix_restored_checkpoints = 0, prefix_offload_lost = 0;
  // The weight version requests are sampled under now, and the updates applied since start
  // (Engine::update_weights).
  int64_t weight_version = 0, weight_updates = 0;
  // On a GPU, since start (engine/step_clock.h): steps timed on the device, the device time they
  // kept it busy, and its idle time between steps the loop ran back to back (the host's overhead
  // between them: read-back, emitting, scheduling, packing; with expert parallelism also the
  // ranks' agreement), for every step and for decode steps (every sequence one token; the gap
  // before them). All zero on the host.
  StepClockTotals device_clock;
};

class Engine {
 public:
  // Takes the model; `tokenizer` (may be null) turns tokens into text deltas and enables stop
  // strings. Sizes the cache pools from the budget; fails when the budget cannot hold one
  // request. Starts the loop thread.
  static absl::StatusOr<std::unique_ptr<Engine>> create(std::unique_ptr<Model> model,
                                                        std::shared_ptr<const Tokenizer> tokenizer,
                                                        const EngineOptions& options);
  // Expert parallelism on one host (issue 16): one loop thread per rank of `ranks`, each with its
  // own requests, scheduler, KV pages and state slots and sessions (options apply per rank), the
  // experts split over the ranks. submit() gives a request (and a session's every turn) to one
  // rank: a session's own, else the rank with the fewest tokens queued plus running. The loops step
  // in lockstep (EngineRankLink); a failed rank group ends every live request with its error and
  // refuses new ones. update_weights is refused.
  static absl::StatusOr<std::unique_ptr<Engine>> create_expert_parallel(
      std::unique_ptr<ExpertParallelRanks> ranks, std::shared_ptr<const Tokenizer> tokenizer,
      const EngineOptions& options);
  ~Engine();  // shutdown()

  // Queues a request and returns its stream. InvalidArgument (nothing queued) for an empty or
  // out-of-vocabulary prompt, invalid sampling parameters, stop strings without a tokenizer, or a
  // prompt + max_tokens over max_model_len (a session turn: history + new tokens + max_tokens),
  // n > 1 on a session; FailedPrecondition after shutdown or while the session's previous turn
  // runs; ResourceExhausted for a new session past max_sessions. Thread-safe.
  // `session_continued` (optional): set to the history tokens a session turn continues from
  // without recomputing them (0 for a new session, a restart or no session).
  absl::StatusOr<std::shared_ptr<RequestStream>> submit(Request request,
                                                        int64_t* session_continued = nullptr);
  // Deletes a session: its history and kept cache. NotFound when there is none. A turn still
  // running completes, but nothing of it is kept. Thread-safe.
  absl::Status delete_session(const std::string& name);
  // Replaces the model's parameter values in place with those of `source` (a trainer's model:
  // every parameter of the engine's model must be in it under the same canonical name and shape,
  // in the same dtype or in f32 for a bf16 engine parameter, which the copy rounds to nearest even
  // as the loader does; the source may be on another device) and returns the new weight version
  // (the previous one + 1; every RequestOutput carries the version its request was sampled under).
  // The copy runs on the loop thread between steps, and this call waits for it (and for the
  // device's copies: the trainer may change `source` once it returns). It also drops the prefix
  // cache (attention pages and linear-state checkpoints) and every session's kept cache, so nothing
  // the old weights computed is reused: a session's next turn is recomputed from its history.
  // FailedPrecondition (nothing changed) while any request is live, after shutdown, or when the
  // model's parameters are read-only (load it with Placement::trainable or ::writable to update
  // it); InvalidArgument naming the first parameter that is missing or differs in shape, or whose
  // dtypes do not convert (any pair but f32 into bf16: FP8 engine weights would need
  // re-quantization). Thread-safe; `source` must not change during the call.
  absl::StatusOr<int64_t> update_weights(const ParameterArena& source);
  // Cancels a live request (its choices end with kCancelled; pages and slot are freed at the next
  // step). Unknown or finished ids are ignored. Thread-safe.
  void cancel(uint64_t request_id);
  // Stops admitting, cancels everything still live, joins the loop thread. Idempotent.
  void shutdown();
  // Waits until no request is live (for drains and tests).
  void wait_idle();

  // A snapshot published at the end of each engine step: events of a step can reach a client before
  // the snapshot that counts them (poll, or wait_idle() first).
  EngineStats stats() const;
  // Expert parallelism: ranks (1 without), each rank's own snapshot (stats() sums them), and the
  // ranks' expert load balance (ExpertParallelRanks::load_balance; nullopt on one rank).
  int num_ranks() const { return static_cast<int>(ranks_.size()); }
  // The group rank of this engine's rank 0: 0, or with ranks on several nodes (--nnodes) this
  // node's first (ExpertParallelRanks::first_rank).
  int first_rank() const;
  std::vector<EngineStats> rank_stats() const;
  std::optional<double> expert_load_balance() const;
  int64_t expert_replacements() const;
  // OK, or the rank group's first failure (expert parallelism; always OK on one rank): once
  // failed, every live request has ended or is ending with it and submit() refuses.
  absl::Status rank_group_status() const;
  // Tokens queued plus running on rank r (what submit() spreads requests by).
  int64_t rank_load_tokens(int r) const;
  const ModelConfig& config() const;
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }
  int32_t max_model_len() const { return max_model_len_; }
  int32_t max_n() const { return options_.max_n; }  // the largest n submit() accepts
  // How the device's memory was split when the cache budget was derived (options'
  // cache_budget_bytes == 0; engine/device_memory_plan.h), else nullopt.
  const std::optional<DeviceMemoryPlan>& memory_plan() const { return memory_plan_; }
  // What was recorded at start-up when decode steps run as CUDA graphs, else nullopt.
  const std::optional<GraphCaptureReport>& graph_capture() const { return graph_capture_; }

 private:
  // One rank: its model, loop thread and what other threads share with it.
  struct Rank {
    std::unique_ptr<Model> model;
    // Shared by every thread (their own mutexes): requests and cancellations in, stats out;
    // session histories.
    std::unique_ptr<EngineInbox> inbox;
    std::unique_ptr<SessionStore> sessions;
    // Touched only by the loop thread after create(); declared after what it references.
    std::unique_ptr<EngineLoop> loop;
    std::thread thread;
  };

  Engine() = default;
  // Checks the model against the options and tokenizer (the first rank's) and sets the limits.
  absl::Status init(const Model& model, std::shared_ptr<const Tokenizer> tokenizer,
                    const EngineOptions& options);
  // Adds a rank of `size` running `model` and its loop (not yet started).
  absl::Status add_rank(std::unique_ptr<Model> model, int size, const EngineRankLink* link);
  // The context-limit and KV-capacity checks of submit() on the whole prompt.
  absl::Status check_length(const Request& request) const;
  // The rank a new request (or a new session) goes to: the fewest tokens queued plus running.
  int least_loaded_rank() const;
  // submit() of a session turn on rank r.
  absl::StatusOr<std::shared_ptr<RequestStream>> submit_turn(Rank& rank, Request request,
                                                             int64_t* session_continued);
  // After a push to rank r: the other ranks join the step it starts at once (not at their idle
  // poll).
  void wake_others(int r);

  // Constant after create().
  std::shared_ptr<const Tokenizer> tokenizer_;
  EngineOptions options_;
  int32_t max_model_len_ = 0;
  int64_t kv_pages_ = 0;  // KV pool capacity (0: no attention layers)
  std::optional<DeviceMemoryPlan> memory_plan_;
  std::optional<GraphCaptureReport> graph_capture_;
  // Expert parallelism: the ranks' communicators and dispatchers, which the models use (declared
  // before ranks_: destroyed after them). Null for one rank.
  std::unique_ptr<ExpertParallelRanks> expert_parallel_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  // Expert parallelism: a session turn finds its session's rank, or places a new session, under
  // this lock, so one name never lives on two ranks.
  absl::Mutex placing_;
};

}  // namespace loom
