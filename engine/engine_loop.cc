#include "engine/engine_loop.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "engine/choice_text.h"
#include "engine/device_memory_plan.h"
#include "engine/model/cache_store.h"
#include "engine/model_runner.h"
#include "engine/parallel/communicator.h"
#include "engine/routed_experts.h"
#include "engine/sampling/sampler.h"
#include "engine/session_offload.h"
#include "engine/session_store.h"
#include "scheduler/cache_sizing.h"
#include "scheduler/scheduler.h"

namespace loom {
namespace {

// Scheduler ids: request id * kMaxN + choice index, so one engine request maps to n scheduler
// requests without a second table.
uint64_t sched_id(uint64_t request_id, int32_t index) { return request_id * kMaxN + index; }
uint64_t request_of(uint64_t sched_id) { return sched_id / kMaxN; }
int32_t index_of(uint64_t sched_id) { return static_cast<int32_t>(sched_id % kMaxN); }

bool contains(std::span<const int32_t> ids, int32_t token) {
  return std::find(ids.begin(), ids.end(), token) != ids.end();
}

void count_finished(FinishReason reason, EngineStats& stats) {
  switch (reason) {
    case FinishReason::kStop:
      ++stats.finished_stop;
      break;
    case FinishReason::kLength:
      ++stats.finished_length;
      break;
    case FinishReason::kCancelled:
      ++stats.finished_cancelled;
      break;
    case FinishReason::kError:
      ++stats.finished_error;
      break;
    case FinishReason::kNone:
      break;
  }
}

}  // namespace

// One choice (n > 1 gives several) of a live request.
struct EngineLoop::Choice {
  int32_t index = 0;
  std::unique_ptr<SamplerState> sampler;
  ChoiceText text;
  int32_t generated = 0;
  bool admitted = false;  // handed to the scheduler
  bool seen = false;      // scheduled at least once (prefix-hit accounting)
  int32_t cached = 0;     // RequestOutput::cached_tokens, set when first scheduled
  bool done = false;
  // Positions computed since the last event (Request::return_routed_experts).
  std::vector<RoutedExperts> routed;
  // Set when the engine tells the scheduler the sequence finished (a stop, a failed step): the
  // scheduler reports only that the engine ended it.
  FinishReason reason = FinishReason::kNone;
  std::string error;
};

struct EngineLoop::LiveRequest {
  uint64_t id = 0;
  uint64_t session = 0;        // the session's key for a session turn, else 0
  int64_t continued = 0;       // a session turn: the history tokens it continues
  int64_t weight_version = 0;  // the loop's weight version when the request became live
  // A session turn that the scheduler finished: the sequence's tokens (the next history).
  std::optional<std::vector<int32_t>> session_history;
  Request request;
  std::shared_ptr<RequestStream> stream;
  std::vector<Choice> choices;
  int32_t open = 0;  // choices not yet finished
};

EngineLoop::EngineLoop(const EngineOptions& options, const Tokenizer* tokenizer, int64_t vocab,
                       Device device, EngineInbox& inbox, SessionStore& sessions)
    : options_(options),
      tokenizer_(tokenizer),
      vocab_(vocab),
      inbox_(inbox),
      sessions_(sessions),
      clock_(device),
      exec_(exec_for(device)) {}

EngineLoop::~EngineLoop() = default;

absl::StatusOr<std::unique_ptr<EngineLoop>> EngineLoop::create(
    const Model& model, const Tokenizer* tokenizer, const EngineOptions& options,
    EngineInbox& inbox, SessionStore& sessions, const EngineRankLink* link) {
  const ModelConfig& cfg = model.config();
  // Size the pools from the store's own byte counts: per-token KV bytes of each attention
  // layer, state bytes per slot.
  CacheStore::Options store_options;  // on the model's device
  store_options.page_size = options.page_size;
  store_options.device = model.device();
  store_options.kv_dtype = options.kv_dtype.value_or(model.act_dtype());
  store_options.act_dtype = model.act_dtype();
  LOOM_RETURN_IF_ERROR(CacheStore::validate(cfg, store_options));
  const std::vector<int64_t> kv_per_token =
      CacheStore::kv_bytes_per_token(cfg, store_options.kv_dtype);
  CacheSizingInput sizing_in;
  sizing_in.kv_bytes_per_token = kv_per_token;
  sizing_in.state_bytes_per_slot =
      static_cast<int64_t>(CacheStore::slot_bytes(cfg, store_options.act_dtype));
  // A derived budget measures what the weights leave (device_memory_plan.h); the sampler is
  // created first so that its scratch is resident when the free memory is read.
  auto sampler = std::make_unique<BatchSampler>(model.device());
  std::optional<DeviceMemoryPlan> plan;
  if (options.cache_budget_bytes == 0) {
    LOOM_ASSIGN_OR_RETURN(plan, plan_device_memory(model, options, *sampler));
  }
  sizing_in.budget_bytes = plan ? plan->cache_budget_bytes : options.cache_budget_bytes;
  sizing_in.page_size = options.page_size;
  sizing_in.max_num_seqs = options.max_num_seqs;
  sizing_in.num_checkpoint_slots = options.enable_prefix_cache ? -1 : 0;
  LOOM_ASSIGN_OR_RETURN(CacheSizing sizing, cache_sizing_compute(sizing_in));

  std::unique_ptr<EngineLoop> loop(
      new EngineLoop(options, tokenizer, cfg.vocab_size, model.device(), inbox, sessions));
  loop->link_ = link;
  store_options.num_pages = sizing.num_pages;
  store_options.num_slots = sizing.num_state_slots;
  LOOM_ASSIGN_OR_RETURN(loop->store_, CacheStore::create(cfg, store_options));
  SchedulerConfig sc;
  sc.max_num_batched_tokens = options.max_num_batched_tokens;
  sc.max_num_seqs = options.max_num_seqs;
  sc.page_size = options.page_size;
  sc.has_attention_layers = loop->store_->has_attention();
  sc.has_linear_layers = loop->store_->has_linear();
  sc.num_pages = sizing.num_pages;
  sc.num_state_slots = sizing.num_state_slots;
  sc.enable_prefix_cache = options.enable_prefix_cache;
  sc.checkpoint_interval = options.checkpoint_interval;
  sc.parking.page_bytes =
      static_cast<int64_t>(CacheStore::page_bytes(cfg, options.page_size, store_options.kv_dtype));
  sc.parking.slot_bytes = sizing_in.state_bytes_per_slot;
  sc.parking.max_bytes_per_sequence = options.session_max_bytes;
  sc.parking.max_bytes = options.sessions_max_bytes;
  if (options.session_offload_bytes > 0) {
    HostCacheTier::Options to;
    to.max_bytes = options.session_offload_bytes;
    to.dir = options.session_offload_dir;
    to.max_disk_bytes = options.session_offload_disk_bytes;
    LOOM_ASSIGN_OR_RETURN(std::unique_ptr<HostCacheTier> tier,
                          HostCacheTier::create(to, loop->store_->exec()));
    loop->offload_ = std::make_unique<SessionOffload>(*loop->store_, std::move(tier));
    sc.offload = loop->offload_.get();
  }
  // The prefix cache's evicted blocks get a tier of their own: they do not compete with sessions
  // for the session budget, and the cache indexes its blobs (report_evictions). Host memory only:
  // a block is one page or one slot, cheaper to recompute than to keep in a file per block.
  if (options.enable_prefix_cache && options.prefix_offload_bytes > 0) {
    HostCacheTier::Options to;
    to.max_bytes = options.prefix_offload_bytes;
    to.report_evictions = true;
    LOOM_ASSIGN_OR_RETURN(std::unique_ptr<HostCacheTier> tier,
                          HostCacheTier::create(to, loop->store_->exec()));
    loop->prefix_offload_ = std::make_unique<SessionOffload>(*loop->store_, std::move(tier));
    sc.prefix_offload = loop->prefix_offload_.get();
  }
  LOOM_ASSIGN_OR_RETURN(loop->sched_, Scheduler::create(sc));
  if (cfg.eos_token_id >= 0) loop->eos_ids_.push_back(cfg.eos_token_id);
  loop->seeds_.seed(options.seed != 0 ? options.seed : std::random_device{}());
  loop->runner_ =
      std::make_unique<ModelRunner>(model, *loop->store_, options.deterministic,
                                    plan ? static_cast<size_t>(plan->workspace_bytes) : 0);
  loop->sampler_ = std::move(sampler);
  loop->routing_ = std::make_unique<RoutedExpertsRecorder>(cfg);
  loop->memory_plan_ = plan;
  // The largest step the scheduler can plan, so that no serving step grows the step data: the
  // token budget, every running sequence asking for logits, and the longest context's pages.
  StepShape largest;
  largest.tokens = options.max_num_batched_tokens;
  largest.seqs = options.max_num_seqs;
  largest.logit_rows = options.max_num_seqs;
  if (loop->store_->has_attention()) {
    const int64_t context = options.max_model_len > 0 ? options.max_model_len
                            : cfg.max_position_embeddings > 0
                                ? cfg.max_position_embeddings
                                : sizing.num_pages * options.page_size;
    largest.page_cols =
        std::min<int64_t>(sizing.num_pages, (context + options.page_size - 1) / options.page_size);
  }
  loop->runner_->reserve(largest);
  loop->runner_->set_step_clock(&loop->clock_);
  if (options.cuda_graphs && graphs_supported(model.device())) {
    absl::StatusOr<GraphCaptureReport> report = loop->runner_->enable_decode_graphs(largest);
    if (!report.ok())
      return absl::Status(report.status().code(),
                          absl::StrCat(report.status().message(),
                                       " (--cuda_graphs=false runs decode steps without graphs)"));
    loop->graph_capture_ = *std::move(report);
  }
  // Totals count what requests can get: the scratch page and slot are never handed out.
  loop->stats_.pages_total = loop->sched_->kv_pool().free_count();
  loop->stats_.slots_total = loop->sched_->slot_pool().free_count();
  loop->publish_stats();
  return loop;
}

int64_t EngineLoop::kv_page_capacity() const {
  return store_->has_attention() ? sched_->kv_pool().capacity() : 0;
}

void EngineLoop::run() {
  if (link_ != nullptr) return run_lockstep();
  for (;;) {
    EngineInbox::Intake in = inbox_.take(sched_->has_unfinished(), next_expiry_);
    drop_sessions(in.dropped_sessions);
    if (absl::Now() >= next_expiry_) drop_sessions(sessions_.expire(absl::Now()));
    // Updates first: the arrivals taken with them were submitted around the update call and are
    // sampled under the new weights (their outputs say so).
    for (EngineInbox::WeightUpdate* u : in.weight_updates) {
      if (in.stopping) {
        u->result = absl::FailedPreconditionError("the engine is shutting down");
        u->done.Notify();
      } else {
        update_weights(*u);
        step_left_work_ = false;  // the weights' upload is not the host's overhead
      }
    }
    for (EngineInbox::Pending& p : in.arrivals) add_request(std::move(p));
    if (in.stopping) {
      for (auto& [id, r] : live_) in.cancels.push_back(id);
    }
    for (uint64_t id : in.cancels) cancel_request(id);
    if (in.stopping) break;
    if (sched_->has_unfinished()) {
      step();
    } else {
      step_left_work_ = false;
    }
    next_expiry_ = sessions_.next_expiry();
    publish_stats();
  }
  publish_stats();
}

absl::StatusOr<EngineLoop::Agreement> EngineLoop::agree(bool stopping, bool busy) {
  Communicator& comm = *link_->comm;
  int64_t mine[2] = {stopping ? 1 : 0, busy ? 1 : 0};
  std::vector<int64_t> all(2 * static_cast<size_t>(comm.size()));
  LOOM_RETURN_IF_ERROR(comm.all_gather(Tensor::wrap(mine, {1, 2}, DType::kI64),
                                       Tensor::wrap(all.data(), {comm.size(), 2}, DType::kI64)));
  Agreement a;
  for (int r = 0; r < comm.size(); ++r) {
    a.stopping |= all[2 * r] != 0;
    a.busy |= all[2 * r + 1] != 0;
  }
  return a;
}

void EngineLoop::run_lockstep() {
  bool& group_busy = group_busy_;
  for (;;) {
    // Idle, a rank still passes every idle_poll: a peer's arrivals start a step it must join.
    const absl::Time deadline =
        group_busy ? next_expiry_ : std::min(next_expiry_, absl::Now() + link_->idle_poll);
    EngineInbox::Intake in = inbox_.take(group_busy || sched_->has_unfinished(), deadline);
    drop_sessions(in.dropped_sessions);
    if (absl::Now() >= next_expiry_) drop_sessions(sessions_.expire(absl::Now()));
    for (EngineInbox::WeightUpdate* u : in.weight_updates) {
      u->result = absl::FailedPreconditionError(
          "update_weights: not with expert parallelism (each rank holds only its experts)");
      u->done.Notify();
    }
    for (EngineInbox::Pending& p : in.arrivals) add_request(std::move(p));
    for (uint64_t id : in.cancels) cancel_request(id);
    absl::StatusOr<Agreement> a = agree(in.stopping, sched_->has_unfinished());
    if (!a.ok()) {
      fail_everything(a.status());
      break;
    }
    if (a->stopping) {  // every rank leaves at this pass, whichever saw the stop
      std::vector<uint64_t> ids;
      for (auto& [id, r] : live_) ids.push_back(id);
      for (uint64_t id : ids) cancel_request(id);
      break;
    }
    group_busy = a->busy;
    if (group_busy) {
      step();  // an empty plan runs a dummy forward
      if (link_->after_step) link_->after_step();
    } else {
      step_left_work_ = false;
    }
    if (absl::Status st = link_->comm->status(); !st.ok()) {
      fail_everything(st);
      break;
    }
    next_expiry_ = sessions_.next_expiry();
    publish_stats();
  }
  publish_stats();
}

void EngineLoop::fail_everything(const absl::Status& why) {
  const absl::Status failed(why.code(),
                            absl::StrCat("expert-parallel ranks failed: ", why.message()));
  inbox_.fail(failed);
  // What was queued before the inbox closed ends here too.
  for (EngineInbox::Pending& p : inbox_.take(true).arrivals) add_request(std::move(p));
  for (auto& [id, r] : live_) {
    for (Choice& c : r->choices) {
      if (c.done) continue;
      if (c.admitted) sched_->cancel(sched_id(r->id, c.index)).IgnoreError();
      finish(*r, c, FinishReason::kError, std::string(failed.message()));
    }
  }
  live_.clear();
}

void EngineLoop::drop_sessions(const std::vector<uint64_t>& keys) {
  for (uint64_t key : keys) sched_->drop_parked(key);
}

void EngineLoop::update_weights(EngineInbox::WeightUpdate& update) {
  if (!live_.empty() || sched_->has_unfinished()) {
    update.result = absl::FailedPreconditionError(
        absl::StrCat("update_weights: ", live_.size(),
                     " requests are live; update the weights between generations (wait for every "
                     "stream to finish, e.g. Engine::wait_idle)"));
    update.done.Notify();
    return;
  }
  update.copy();
  // Cached prefixes and parked session states hold attention pages and linear-attention states
  // the old weights computed; reusing them would mix two policies in one sequence.
  const absl::Status cleared = sched_->invalidate_caches();
  LOOM_CHECK(cleared.ok(), "invalidate_caches with no live request: %s",
             std::string(cleared.message()).c_str());
  stats_.weight_version = ++weight_version_;
  ++stats_.weight_updates;
  update.version = weight_version_;
  update.result = absl::OkStatus();
  publish_stats();  // stats() read right after the call shows the new version and empty caches
  update.done.Notify();
}

void EngineLoop::end_session(LiveRequest& r, FinishReason reason) {
  const bool completed = reason == FinishReason::kStop || reason == FinishReason::kLength;
  std::optional<std::vector<int32_t>> history;
  if (completed) history = std::move(r.session_history);
  // A failed step may have left the parked state half written; the old history is recomputed.
  // (A cancelled turn parked nothing: what was parked before it, if still there, stays valid.)
  if (reason == FinishReason::kError) sched_->drop_parked(r.session);
  if (!sessions_.end_turn(r.session, std::move(history), absl::Now()))
    sched_->drop_parked(r.session);  // deleted while the turn ran
}

void EngineLoop::add_request(EngineInbox::Pending pending) {
  auto r = std::make_unique<LiveRequest>();
  r->id = pending.id;
  r->session = pending.session;
  r->continued = pending.continued;
  r->weight_version = weight_version_;
  r->request = std::move(pending.request);
  r->stream = std::move(pending.stream);
  const SamplingParams& sp = r->request.params;
  r->open = sp.n;
  for (int32_t i = 0; i < sp.n; ++i) {
    const uint64_t seed = sp.seed ? *sp.seed + static_cast<uint64_t>(i) : seeds_();
    r->choices.push_back(Choice{.index = i,
                                .sampler = std::make_unique<SamplerState>(seed, r->request.prompt),
                                .text = ChoiceText(tokenizer_, sp.stop)});
  }
  // n > 1 shares one prefill: choice 0 goes first; the others follow once its prompt is in the
  // prefix cache (after its first sampled token), and restore from there.
  const bool defer = options_.enable_prefix_cache && sp.n > 1;
  for (Choice& c : r->choices)
    if (c.index == 0 || !defer) admit(*r, c);
  stats_.prompt_tokens += static_cast<int64_t>(r->request.prompt.size());
  if (r->open > 0) live_.emplace(r->id, std::move(r));
}

void EngineLoop::cancel_request(uint64_t request_id) {
  auto it = live_.find(request_id);
  if (it == live_.end()) return;
  LiveRequest& r = *it->second;
  for (Choice& c : r.choices) {
    if (c.done) continue;
    if (c.admitted) sched_->cancel(sched_id(r.id, c.index)).IgnoreError();
    finish(r, c, FinishReason::kCancelled, "");
  }
  live_.erase(it);
}

void EngineLoop::admit(LiveRequest& r, Choice& c) {
  SchedRequest sr;
  sr.id = sched_id(r.id, c.index);
  sr.prompt = r.request.prompt;
  sr.max_new_tokens = r.request.params.max_tokens;
  sr.priority = r.request.priority;
  sr.park_key = r.session;
  absl::Status st = sched_->add(std::move(sr));
  c.admitted = st.ok();
  if (!st.ok()) finish(r, c, FinishReason::kError, std::string(st.message()));
}

void EngineLoop::step() {
  BatchPlan plan = sched_->schedule();
  stats_.preemptions += static_cast<int64_t>(plan.preempted.size());
  bool decode = !plan.seqs.empty();
  for (const SeqPlan& s : plan.seqs) decode = decode && s.tokens.size() == 1;
  // Session caches parked or restored since the last step put their copies on the stream in the
  // gap: it is then no measure of the host's overhead.
  clock_.begin_step(decode, step_left_work_ && offload_moves() == offload_moves_at_end_);
  // A step records its routing only when a planned request asked for it.
  std::optional<ActivationTape> tape;
  if (plan_records_routing(plan)) tape = routing_->make_tape();
  absl::StatusOr<Tensor> logits = plan.seqs.empty()
                                      ? absl::StatusOr<Tensor>(Tensor::empty({0, vocab_}))
                                      : runner_->run(plan, tape ? &*tape : nullptr);
  if (link_ != nullptr) {
    if (plan.seqs.empty()) {
      // Nothing of this rank's runs, but its experts serve the other ranks' tokens.
      link_->set_dummy_step(true);
      const absl::Status dummy = runner_->run_dummy();
      link_->set_dummy_step(false);
      if (!dummy.ok()) logits = dummy;
    }
    // A failed exchange leaves the MoE outputs zero (expert_parallel_dispatcher.h): the logits
    // are not the model's.
    if (absl::Status st = link_->comm->status(); logits.ok() && !st.ok()) logits = st;
    // A forward that failed here skipped the rest of the step's collectives: the others would
    // wait for them until the timeout, so the group fails now, with this rank's error.
    if (!logits.ok() && link_->comm->status().ok())
      link_->comm->abort(absl::Status(
          logits.status().code(),
          absl::StrCat("rank ", link_->comm->rank(), ": ", logits.status().message())));
  }
  StepResult result;
  if (logits.ok()) {
    ++stats_.steps;
    if (tape) collect_routing(plan, *tape);
    result = sample_and_emit(plan, *logits);
  } else {
    result = fail_step(plan, logits.status());
  }
  complete(result);
  step_left_work_ = sched_->has_unfinished();
}

bool EngineLoop::plan_records_routing(const BatchPlan& plan) {
  for (const SeqPlan& s : plan.seqs)
    if (const LiveRequest* r = find_request(s.request_id); r && r->request.return_routed_experts)
      return true;
  return false;
}

void EngineLoop::collect_routing(const BatchPlan& plan, const ActivationTape& tape) {
  routing_->prepare(tape);
  int64_t row = 0;
  for (const SeqPlan& s : plan.seqs) {
    const int64_t rows = static_cast<int64_t>(s.tokens.size());
    if (LiveRequest* r = find_request(s.request_id); r && r->request.return_routed_experts) {
      Choice& c = r->choices[index_of(s.request_id)];
      if (!c.done) routing_->append(row, rows, s.start_pos, c.routed);
    }
    row += rows;
  }
}

StepResult EngineLoop::sample_and_emit(const BatchPlan& plan, const Tensor& logits) {
  // One logits row per sampling sequence, in plan order: every row is sampled in one call (on
  // the logits' device), then the tokens are emitted in plan order.
  step_choices_.clear();
  slots_.clear();
  for (const SeqPlan& s : plan.seqs) {
    LiveRequest* r = find_request(s.request_id);
    Choice* c = r ? &r->choices[index_of(s.request_id)] : nullptr;
    if (c != nullptr && !c->seen) {
      c->seen = true;
      stats_.prefix_query_tokens += static_cast<int64_t>(r->request.prompt.size());
      stats_.prefix_hit_tokens += s.start_pos;
      // A session turn counts only its history: resumed from the kept cache it starts at the
      // history's last token (sampled by the previous turn, never fed), recomputed where the
      // prefix cache ended.
      const int64_t hit = s.start_pos;
      c->cached =
          static_cast<int32_t>(r->session == 0 || hit + 1 < r->continued ? hit : r->continued);
    }
    step_choices_.emplace_back(r, c);
    if (!s.sample) continue;
    SampleSlot slot;
    if (c != nullptr && !c->done) {  // else cancelled meanwhile: the row is not sampled
      const SamplingParams& sp = r->request.params;
      slot = {.state = c->sampler.get(),
              .params = &sp,
              .eos_ids = sp.ignore_eos ? std::span<const int32_t>() : eos_ids_};
    }
    slots_.push_back(slot);
  }
  const std::vector<SampledToken>& tokens = sampler_->sample(logits, slots_);
  clock_.mark_end(exec_);
  offload_moves_at_end_ = offload_moves();

  StepResult result;
  size_t row = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const SeqPlan& s = plan.seqs[i];
    SeqResult sr;
    sr.request_id = s.request_id;
    if (!s.sample) {
      result.seqs.push_back(sr);
      continue;
    }
    const SampleSlot& slot = slots_[row];
    const SampledToken& tok = tokens[row];
    ++row;
    if (slot.state == nullptr) {  // the scheduler ignores the result
      sr.token = 0;
      result.seqs.push_back(sr);
      continue;
    }
    LiveRequest* r = step_choices_[i].first;
    Choice* c = step_choices_[i].second;
    ++c->generated;
    ++stats_.generated_tokens;
    inbox_.add_load(1);
    sr.token = tok.token;
    if (emit(*r, *c, tok)) {
      sr.finished = true;
      c->reason = FinishReason::kStop;
    }
    result.seqs.push_back(sr);
    // First token of choice 0: the prompt is now in the prefix cache; admit the siblings.
    if (c->index == 0 && c->generated == 1)
      for (Choice& sib : r->choices)
        if (!sib.admitted && !sib.done) admit(*r, sib);
  }
  return result;
}

bool EngineLoop::emit(LiveRequest& r, Choice& c, const SampledToken& token) {
  const SamplingParams& sp = r.request.params;
  RequestOutput out;
  out.index = c.index;
  out.token_ids.push_back(token.token);
  out.weight_version = r.weight_version;
  out.routed_experts = std::move(c.routed);
  c.routed.clear();
  if (sp.logprobs >= 0) out.logprobs.push_back({token.token, token.logprob, token.top_logprobs});
  const bool past_min = c.generated > sp.min_tokens;
  bool stop = past_min && ((!sp.ignore_eos && contains(eos_ids_, token.token)) ||
                           contains(sp.stop_token_ids, token.token));
  // A stopping token (EOS, a stop id) is reported as an id but its text is not output, as OpenAI
  // and vLLM do: with a real tokenizer it would be `<|im_end|>` in the user's text.
  if (!stop) out.text = c.text.push(token.token, past_min, &stop);
  r.stream->push(std::move(out));
  return stop;
}

StepResult EngineLoop::fail_step(const BatchPlan& plan, const absl::Status& error) {
  StepResult result;
  for (const SeqPlan& s : plan.seqs) {
    SeqResult sr;
    sr.request_id = s.request_id;
    if (s.sample) sr.token = 0;
    sr.finished = true;
    result.seqs.push_back(sr);
    if (LiveRequest* r = find_request(s.request_id)) {
      Choice& c = r->choices[index_of(s.request_id)];
      c.reason = FinishReason::kError;
      c.error = std::string(error.message());
    }
  }
  return result;
}

void EngineLoop::complete(const StepResult& result) {
  absl::StatusOr<std::vector<FinishedRequest>> done = sched_->complete(result);
  LOOM_CHECK(done.ok(), "scheduler rejected the engine's step result: %s",
             std::string(done.status().message()).c_str());
  for (FinishedRequest& f : *done) {
    LiveRequest* r = find_request(f.request_id);
    if (r == nullptr) continue;
    Choice& c = r->choices[index_of(f.request_id)];
    if (r->session != 0) r->session_history = std::move(f.tokens);
    // Only a length end is the scheduler's own; the engine recorded every other reason when it
    // reported the sequence finished.
    const FinishReason reason = c.reason != FinishReason::kNone   ? c.reason
                                : f.cause == SchedFinish::kLength ? FinishReason::kLength
                                                                  : FinishReason::kStop;
    finish(*r, c, reason, c.error);
    if (r->open == 0) live_.erase(r->id);
  }
}

void EngineLoop::finish(LiveRequest& r, Choice& c, FinishReason reason, std::string error) {
  if (c.done) return;
  c.done = true;
  RequestOutput out;
  out.index = c.index;
  // A cancelled or failed choice ends where it was cut: its held-back text is dropped.
  if (reason != FinishReason::kCancelled && reason != FinishReason::kError)
    out.text = c.text.finish();
  out.finish = reason;
  out.error = std::move(error);
  out.prompt_tokens = static_cast<int32_t>(r.request.prompt.size());
  out.completion_tokens = c.generated;
  out.cached_tokens = c.cached;
  out.weight_version = r.weight_version;
  inbox_.add_load(-static_cast<int64_t>(r.request.prompt.size()) - c.generated);
  out.routed_experts = std::move(c.routed);  // normally empty: the last sampled token is not fed
  c.routed.clear();
  // The session's turn ends before its last event goes out: a client that sends the next turn
  // as soon as it reads this one must find the session idle, with this turn in its history.
  if (r.session != 0) end_session(r, reason);
  r.stream->push(std::move(out));
  count_finished(reason, stats_);
  if (--r.open == 0) {
    r.stream->close();
    ++closed_;  // the live count drops with the stats update, so wait_idle() sees final pool counts
  }
}

int64_t EngineLoop::offload_moves() const {
  int64_t moves = 0;
  for (const SessionOffload* o : {offload_.get(), prefix_offload_.get()}) {
    if (o != nullptr) moves += o->tier().stats().stored + o->tier().stats().restored;
  }
  return moves;
}

void EngineLoop::publish_stats() {
  stats_.waiting = sched_->num_waiting();
  stats_.running = sched_->num_running();
  stats_.pages_free = sched_->kv_pool().free_count();
  stats_.slots_free = sched_->slot_pool().free_count();
  // Settled only when this loop and its group are idle: a rank stepping dummies for its group
  // must not wait for each one here.
  stats_.device_clock = clock_.totals(/*settle=*/!sched_->has_unfinished() && !group_busy_);
  const ParkedSequences& parked = sched_->parked();
  stats_.sessions_resident = parked.count();
  stats_.session_pages = parked.pages();
  stats_.session_slots = parked.slots();
  stats_.session_bytes = parked.bytes();
  stats_.session_evictions = parked.evictions();
  if (offload_ != nullptr) {
    const HostCacheTier::Stats& t = offload_->tier().stats();
    stats_.sessions_offloaded = t.host_entries;
    stats_.sessions_on_disk = t.disk_entries;
    stats_.session_offload_bytes = t.host_bytes;
    stats_.session_offload_disk_bytes = t.disk_bytes;
    stats_.session_offloads = parked.offloads();
    stats_.session_restores = t.restored;
    stats_.session_offload_lost = t.evicted + t.lost;
    stats_.session_evictions += stats_.session_offload_lost;
  }
  if (prefix_offload_ != nullptr) {
    const PrefixCache::OffloadStats& p = sched_->prefix_cache()->offload_stats();
    stats_.prefix_offload_bytes = prefix_offload_->tier().stats().host_bytes;
    stats_.prefix_offloads = p.offloaded;
    stats_.prefix_offload_hits = p.hits;
    stats_.prefix_restored_pages = p.restored_pages;
    stats_.prefix_restored_checkpoints = p.restored_checkpoints;
    stats_.prefix_offload_lost = p.lost;
  }
  inbox_.publish(stats_, closed_);
  closed_ = 0;
}

EngineLoop::LiveRequest* EngineLoop::find_request(uint64_t sched_id) {
  auto it = live_.find(request_of(sched_id));
  return it == live_.end() ? nullptr : it->second.get();
}

}  // namespace loom
