// EngineLoop: what the engine's loop thread owns and does. Each pass of run() takes what other
// threads queued (EngineInbox), then runs one step, each phase with one owner:
//
//   plan      Scheduler::schedule()         which sequences run and how many tokens each
//   forward   ModelRunner::run()            state slots prepared, one Model::forward -> logits
//   sample    BatchSampler                  one token per sequence that ends its known tokens,
//                                           on the logits' device (SamplerState per choice)
//   emit      ChoiceText, RequestStream     text deltas, stop tokens and strings, output events
//   complete  Scheduler::complete()         positions advance, finished sequences free their memory
//
// and publishes the stats. Nothing here is thread-safe: only Engine::create (before the thread
// starts) and the loop thread touch it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/tensor.h"
#include "engine/device_memory_plan.h"
#include "engine/engine.h"
#include "engine/engine_inbox.h"
#include "engine/sampling/batch_sampler.h"
#include "engine/step_clock.h"
#include "scheduler/batch_plan.h"

namespace loom {

class CacheStore;
class Communicator;
class ModelRunner;
class RoutedExpertsRecorder;
class Scheduler;
class SessionOffload;
class SessionStore;

// Expert parallelism (Engine::create_expert_parallel): what ties one rank's loop to the others'.
// Every pass of every rank's loop runs one agreement (an all-gather: is any rank stopping, does any
// have work) and then, when some rank has work, one forward on every rank, a rank without tokens
// running a dummy one, so that every rank issues the same collectives in the same order. An idle
// rank waits at most `idle_poll` for requests before its next pass, so no rank waits at a
// collective for a peer asleep in its inbox.
struct EngineRankLink {
  Communicator* comm = nullptr;
  std::function<void(bool)> set_dummy_step;  // the rank's MoE dispatchers (or load balancer)
  std::function<void()> after_step;          // optional: publishes what the step's rank measured
  absl::Duration idle_poll = absl::Milliseconds(20);
};

class EngineLoop {
 public:
  // Sizes the KV page and state slot pools from options.cache_budget_bytes and builds the
  // scheduler and the model runner. Fails when the budget cannot hold one request. `model`,
  // `tokenizer` (may be null), `inbox` and `sessions` must outlive the loop. Publishes the first
  // stats.
  static absl::StatusOr<std::unique_ptr<EngineLoop>> create(
      const Model& model, const Tokenizer* tokenizer, const EngineOptions& options,
      EngineInbox& inbox, SessionStore& sessions, const EngineRankLink* link = nullptr);
  ~EngineLoop();

  // The KV pool's size in pages, the most one request can ever hold (0: no attention layers).
  int64_t kv_page_capacity() const;
  // The derived device memory plan (EngineOptions::cache_budget_bytes == 0), else nullopt.
  const std::optional<DeviceMemoryPlan>& memory_plan() const { return memory_plan_; }
  // The start-up recording of the decode graphs (EngineOptions::cuda_graphs on a GPU), else
  // nullopt.
  const std::optional<GraphCaptureReport>& graph_capture() const { return graph_capture_; }

  // The loop thread's body: passes until the inbox says stopping, which cancels everything live.
  void run();

 private:
  // run() of an expert-parallel rank (link_ set): the lockstep passes.
  void run_lockstep();
  // The lockstep's agreement: whether any rank is stopping, whether any has work.
  struct Agreement {
    bool stopping = false, busy = false;
  };
  absl::StatusOr<Agreement> agree(bool stopping, bool busy);
  // The rank group failed (a rank's error, or a collective timed out): every live request ends
  // with `why`, and the inbox refuses new ones with it.
  void fail_everything(const absl::Status& why);
  struct Choice;
  struct LiveRequest;

  EngineLoop(const EngineOptions& options, const Tokenizer* tokenizer, int64_t vocab, Device device,
             EngineInbox& inbox, SessionStore& sessions);

  // Intake: new requests become live (their first choices admitted), cancelled ones end.
  void add_request(EngineInbox::Pending pending);
  void cancel_request(uint64_t request_id);
  // Hands a choice to the scheduler; a refusal ends it with kError.
  void admit(LiveRequest& r, Choice& c);

  // One step: plan, forward, then sample_and_emit() (or fail_step()), then complete().
  void step();
  // Whether a planned sequence's request asked for its routing (Request::return_routed_experts).
  bool plan_records_routing(const BatchPlan& plan);
  // Hands each such sequence its rows of the step's routing (`tape`), to go out with its next
  // event.
  void collect_routing(const BatchPlan& plan, const ActivationTape& tape);
  StepResult sample_and_emit(const BatchPlan& plan, const Tensor& logits);
  // Streams one token sampled for `c`; returns whether it stops the choice (a stop token, or a
  // stop string completed by its text).
  bool emit(LiveRequest& r, Choice& c, const SampledToken& token);
  // A failed forward is a bug (the plan was validated): the step's choices end with `error` and
  // the engine keeps serving.
  StepResult fail_step(const BatchPlan& plan, const absl::Status& error);
  void complete(const StepResult& result);

  // Publishes a choice's final event; closes the stream after the request's last open choice.
  // Ends a session turn (end_session).
  void finish(LiveRequest& r, Choice& c, FinishReason reason, std::string error);
  // A session turn ended with `reason`: a stop or length keeps the sequence's tokens as the
  // session's history (r.session_history, from the scheduler) and the cache the scheduler parked;
  // anything else keeps the old history and drops what was parked.
  void end_session(LiveRequest& r, FinishReason reason);
  // Drops the cache kept for the sessions deleted or expired since the last pass.
  void drop_sessions(const std::vector<uint64_t>& keys);
  // Applies a queued weight update between steps: refused (FailedPrecondition) while any request
  // is live; otherwise the parameters are written, the prefix cache and the sessions' kept caches
  // are dropped (computed by the old weights) and the version goes up by one.
  void update_weights(EngineInbox::WeightUpdate& update);
  void publish_stats();
  // Blobs the offload tiers (sessions, prefix cache) have stored or handed back since start.
  int64_t offload_moves() const;

  // The live request a scheduler id names; null once it is gone (finished or cancelled).
  LiveRequest* find_request(uint64_t sched_id);

  // Constant after create().
  const EngineOptions options_;
  const Tokenizer* const tokenizer_;  // may be null
  const int64_t vocab_;
  const EngineRankLink* link_ = nullptr;  // expert parallelism, else null
  std::vector<int32_t> eos_ids_;
  EngineInbox& inbox_;
  SessionStore& sessions_;

  // Owned by the loop thread (the store first, destroyed last: the runner writes into it).
  std::unique_ptr<CacheStore> store_;
  std::unique_ptr<SessionOffload> offload_;  // null when off; the scheduler points at it
  // The prefix cache's tier (EngineOptions::prefix_offload_bytes); null when off.
  std::unique_ptr<SessionOffload> prefix_offload_;
  std::unique_ptr<Scheduler> sched_;
  DeviceStepClock clock_;  // the runner marks each step's first device work on it
  // Whether the last pass ran a step that left work: the next step follows it at once, so the
  // device's idle time between the two is the host's overhead (clock_'s gaps).
  bool step_left_work_ = false;
  // The offload tier's blob moves when the last step ended: moves since then put device copies in
  // the gap before the next step, which is then not measured.
  int64_t offload_moves_at_end_ = 0;
  bool group_busy_ = false;  // expert parallelism: the group has work (run_lockstep)
  Exec exec_;                // the model's device's
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<BatchSampler> sampler_;
  // Cuts a step's routing into the requests that asked for it (Request::return_routed_experts).
  std::unique_ptr<RoutedExpertsRecorder> routing_;
  std::optional<DeviceMemoryPlan> memory_plan_;                       // constant after create()
  std::optional<GraphCaptureReport> graph_capture_;                   // constant after create()
  absl::flat_hash_map<uint64_t, std::unique_ptr<LiveRequest>> live_;  // by request id
  // sample_and_emit's per-step lists, kept for their capacity: the choice of each planned
  // sequence (null when gone) and the sampler's slot of each logits row.
  std::vector<std::pair<LiveRequest*, Choice*>> step_choices_;
  std::vector<SampleSlot> slots_;
  std::mt19937_64 seeds_;  // seeds choices whose request brings none
  EngineStats stats_;      // counters and pool totals; publish_stats() adds the gauges
  absl::Time next_expiry_ = absl::InfiniteFuture();  // the sessions' next ttl expiry
  int64_t closed_ = 0;          // streams closed since the last publish_stats()
  int64_t weight_version_ = 0;  // update_weights() applied so far
};

}  // namespace loom
