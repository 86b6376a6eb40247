#include "engine/engine.h"

#include <algorithm>
#include <random>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "engine/model/cache_store.h"
#include "engine/model_runner.h"
#include "engine/sampling/sampler.h"
#include "engine/stop_checker.h"
#include "scheduler/cache_sizing.h"
#include "scheduler/scheduler.h"

namespace loom {
namespace {

// Scheduler ids: request id * kMaxN + choice index, so one engine request maps to n scheduler
// requests without a second table.
uint64_t sched_id(uint64_t request_id, int32_t index) { return request_id * kMaxN + index; }

}  // namespace

// One choice (n > 1 gives several) of a live request.
struct Choice {
  int32_t index = 0;
  std::unique_ptr<SamplerState> sampler;
  std::unique_ptr<StreamingDetokenizer> detok;
  std::unique_ptr<StopChecker> stop;
  int32_t generated = 0;
  bool admitted = false;  // handed to the scheduler
  bool seen = false;      // scheduled at least once (prefix-hit accounting)
  bool done = false;
  bool text_ended = false;  // a stop string matched: no text after it, not even the detok tail
  FinishReason reason = FinishReason::kNone;  // decided by the engine (stop), before complete()
  std::string error;
};

struct LiveRequest {
  uint64_t id = 0;
  Request request;
  std::shared_ptr<RequestStream> stream;
  std::vector<Choice> choices;
  int32_t open = 0;  // choices not yet finished
};

struct Engine::Loop {
  std::unique_ptr<CacheStore> store;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<ModelRunner> runner;
  absl::flat_hash_map<uint64_t, std::unique_ptr<LiveRequest>> live;
  std::vector<int32_t> eos_ids;
  std::mt19937_64 seeds;
};

absl::StatusOr<std::unique_ptr<Engine>> Engine::create(std::unique_ptr<Model> model,
                                                       std::shared_ptr<const Tokenizer> tokenizer,
                                                       const EngineOptions& options) {
  if (model == nullptr) return absl::InvalidArgumentError("Engine::create: no model");
  if (options.max_num_batched_tokens < 1 || options.max_num_seqs < 1 || options.page_size < 1)
    return absl::InvalidArgumentError(
        "max_num_batched_tokens, max_num_seqs and page_size must be >= 1");
  std::unique_ptr<Engine> e(new Engine());
  e->options_ = options;
  e->tokenizer_ = std::move(tokenizer);
  const ModelConfig& cfg = model->config();
  e->max_model_len_ = options.max_model_len > 0         ? options.max_model_len
                      : cfg.max_position_embeddings > 0 ? cfg.max_position_embeddings
                                                        : (1 << 30);
  // Ids past the model's embedding can never be sampled, and prompts holding them are refused per
  // request; only special tokens may lie there (Kimi's tokenizers reserve 258 special ids while
  // Kimi-K2's embedding covers 256 of them). A regular token there means a mismatched tokenizer.
  if (e->tokenizer_) {
    for (int32_t id = cfg.vocab_size; id < e->tokenizer_->vocab_size(); ++id) {
      if (!e->tokenizer_->is_special(id))
        return absl::InvalidArgumentError(absl::StrCat(
            "the tokenizer has ", e->tokenizer_->vocab_size(), " tokens but the model only ",
            cfg.vocab_size, ", and token ", id, " past the model's is not a special token"));
    }
  }

  // Size the pools: per-token KV bytes of each attention layer, state bytes per slot.
  std::vector<int64_t> kv_per_token;
  for (MixerType m : cfg.mixers) {
    if (m == MixerType::kMla)
      kv_per_token.push_back(4LL * (cfg.mla.kv_lora_rank + cfg.mla.qk_rope_head_dim));
    if (m == MixerType::kGqa) kv_per_token.push_back(8LL * cfg.gqa.num_kv_heads * cfg.gqa.head_dim);
  }
  CacheSizingInput sizing_in;
  sizing_in.kv_bytes_per_token = kv_per_token;
  sizing_in.state_bytes_per_slot = static_cast<int64_t>(CacheStore::slot_bytes(cfg));
  sizing_in.budget_bytes = options.cache_budget_bytes;
  sizing_in.page_size = options.page_size;
  sizing_in.max_num_seqs = options.max_num_seqs;
  sizing_in.num_checkpoint_slots = options.enable_prefix_cache ? -1 : 0;
  LOOM_ASSIGN_OR_RETURN(CacheSizing sizing, cache_sizing_compute(sizing_in));

  auto loop = std::make_unique<Loop>();
  loop->store = std::make_unique<CacheStore>(
      cfg, CacheStore::Options{sizing.num_pages, options.page_size, sizing.num_state_slots});
  SchedulerConfig sc;
  sc.max_num_batched_tokens = options.max_num_batched_tokens;
  sc.max_num_seqs = options.max_num_seqs;
  sc.page_size = options.page_size;
  sc.has_attention_layers = loop->store->has_attention();
  sc.has_linear_layers = loop->store->has_linear();
  sc.num_pages = sizing.num_pages;
  sc.num_state_slots = sizing.num_state_slots;
  sc.enable_prefix_cache = options.enable_prefix_cache;
  sc.checkpoint_interval = options.checkpoint_interval;
  LOOM_ASSIGN_OR_RETURN(loop->scheduler, Scheduler::create(sc));
  if (cfg.eos_token_id >= 0) loop->eos_ids.push_back(cfg.eos_token_id);
  loop->seeds.seed(options.seed != 0 ? options.seed : std::random_device{}());
  e->model_ = std::move(model);
  loop->runner = std::make_unique<ModelRunner>(*e->model_, *loop->store, options.deterministic);
  e->loop_ = std::move(loop);
  {
    // Totals count what requests can get: the scratch slot is never handed out.
    absl::MutexLock lock(&e->mu_);
    const Scheduler& sched = *e->loop_->scheduler;
    e->stats_.pages_total = e->stats_.pages_free = sched.kv_pool().free_count();
    e->stats_.slots_total = e->stats_.slots_free = sched.slot_pool().free_count();
    e->kv_pages_ = e->loop_->store->has_attention() ? sched.kv_pool().capacity() : 0;
  }
  e->thread_ = std::thread([p = e.get()] { p->run_loop(); });
  return e;
}

Engine::~Engine() { shutdown(); }

const ModelConfig& Engine::config() const { return model_->config(); }

absl::StatusOr<std::shared_ptr<RequestStream>> Engine::submit(Request request) {
  const ModelConfig& cfg = model_->config();
  if (request.prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  for (size_t i = 0; i < request.prompt.size(); ++i)
    if (request.prompt[i] < 0 || request.prompt[i] >= cfg.vocab_size)
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", request.prompt[i],
                                                     " at position ", i, " is outside [0, ",
                                                     cfg.vocab_size, ")"));
  LOOM_RETURN_IF_ERROR(request.params.validate(cfg.vocab_size));
  if (request.params.n > options_.max_n)
    return absl::InvalidArgumentError(
        absl::StrCat("n: at most ", options_.max_n, " choices per request on this server"));
  if (!request.params.stop.empty() && tokenizer_ == nullptr)
    return absl::InvalidArgumentError("stop strings need a tokenizer; this engine has none");
  const int64_t need = static_cast<int64_t>(request.prompt.size()) + request.params.max_tokens;
  if (need > max_model_len_)
    return absl::InvalidArgumentError(absl::StrCat(
        "the prompt (", request.prompt.size(), " tokens) plus max_tokens (",
        request.params.max_tokens, ") exceeds the context limit of ", max_model_len_, " tokens"));
  if (kv_pages_ > 0 && (need - 1 + options_.page_size - 1) / options_.page_size > kv_pages_)
    return absl::InvalidArgumentError(
        absl::StrCat("the prompt (", request.prompt.size(), " tokens) plus max_tokens (",
                     request.params.max_tokens, ") needs more KV cache than this server has (",
                     kv_pages_, " pages of ", options_.page_size, " tokens)"));
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::FailedPreconditionError("the engine is shutting down");
  const uint64_t id = next_id_++;
  auto stream = std::make_shared<RequestStream>(id, request.params.n);
  inbox_.push_back({id, std::move(request), stream});
  ++live_;
  return stream;
}

void Engine::cancel(uint64_t request_id) {
  absl::MutexLock lock(&mu_);
  cancels_.push_back(request_id);
}

void Engine::shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void Engine::wait_idle() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int64_t* live) { return *live == 0; }, &live_));
}

EngineStats Engine::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void Engine::run_loop() {
  Loop& L = *loop_;
  Scheduler& sched = *L.scheduler;
  const ModelConfig& cfg = model_->config();
  const int64_t vocab = cfg.vocab_size;
  int64_t steps = 0, prompt_tokens = 0, generated = 0, preemptions = 0, hit_tokens = 0,
          query_tokens = 0;
  int64_t finished[8] = {};  // by FinishReason
  int64_t closed = 0;        // streams closed since the last stats update
  auto publish_stats = [&] {
    absl::MutexLock lock(&mu_);
    stats_.waiting = sched.num_waiting();
    stats_.running = sched.num_running();
    stats_.pages_free = sched.kv_pool().free_count();
    stats_.slots_free = sched.slot_pool().free_count();
    stats_.steps = steps;
    stats_.prompt_tokens = prompt_tokens;
    stats_.generated_tokens = generated;
    stats_.preemptions = preemptions;
    stats_.prefix_hit_tokens = hit_tokens;
    stats_.prefix_query_tokens = query_tokens;
    stats_.finished_stop = finished[static_cast<int>(FinishReason::kStop)];
    stats_.finished_length = finished[static_cast<int>(FinishReason::kLength)];
    stats_.finished_cancelled = finished[static_cast<int>(FinishReason::kCancelled)];
    stats_.finished_error = finished[static_cast<int>(FinishReason::kError)];
    live_ -= closed;
    closed = 0;
  };

  // Publishes a choice's final event and closes the stream when it was the last open choice.
  auto finish_choice = [&](LiveRequest& r, Choice& c, FinishReason reason, std::string error) {
    if (c.done) return;
    c.done = true;
    RequestOutput out;
    out.index = c.index;
    if (reason != FinishReason::kCancelled && reason != FinishReason::kError && !c.text_ended) {
      if (c.detok) {
        std::string tail = c.detok->finish();
        bool stopped = false;
        if (c.stop) out.text = c.stop->push(tail, &stopped);
        if (!stopped && c.stop) out.text += c.stop->flush();
        if (!c.stop) out.text = tail;
      }
    }
    out.finish = reason;
    out.error = std::move(error);
    out.prompt_tokens = static_cast<int32_t>(r.request.prompt.size());
    out.completion_tokens = c.generated;
    r.stream->push(std::move(out));
    ++finished[static_cast<int>(reason)];
    if (--r.open == 0) {
      r.stream->close();
      ++closed;  // live_ drops with the stats update, so wait_idle() sees final pool counts
    }
  };

  auto admit_choice = [&](LiveRequest& r, Choice& c) {
    SchedRequest sr;
    sr.id = sched_id(r.id, c.index);
    sr.prompt = r.request.prompt;
    sr.max_new_tokens = r.request.params.max_tokens;
    sr.priority = r.request.priority;
    absl::Status st = sched.add(std::move(sr));
    c.admitted = st.ok();
    if (!st.ok()) finish_choice(r, c, FinishReason::kError, std::string(st.message()));
  };

  for (;;) {
    std::vector<Pending> arrivals;
    std::vector<uint64_t> cancels;
    bool stopping = false;
    {
      // The scheduler belongs to this thread: read it before locking (absl evaluates conditions
      // on whichever thread releases the mutex).
      const bool busy = sched.has_unfinished();
      absl::MutexLock lock(&mu_);
      auto has_work = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return busy || !inbox_.empty() || !cancels_.empty() || stopping_;
      };
      mu_.Await(absl::Condition(&has_work));
      arrivals.swap(inbox_);
      cancels.swap(cancels_);
      stopping = stopping_;
    }
    for (Pending& p : arrivals) {
      auto r = std::make_unique<LiveRequest>();
      r->id = p.id;
      r->request = std::move(p.request);
      r->stream = std::move(p.stream);
      const SamplingParams& sp = r->request.params;
      r->open = sp.n;
      for (int32_t i = 0; i < sp.n; ++i) {
        Choice c;
        c.index = i;
        const uint64_t seed = sp.seed ? *sp.seed + static_cast<uint64_t>(i) : L.seeds();
        c.sampler = std::make_unique<SamplerState>(seed, r->request.prompt);
        if (tokenizer_) c.detok = std::make_unique<StreamingDetokenizer>(*tokenizer_);
        if (!sp.stop.empty()) c.stop = std::make_unique<StopChecker>(sp.stop);
        r->choices.push_back(std::move(c));
      }
      // n > 1 shares one prefill: choice 0 goes first; the others follow once its prompt is in the
      // prefix cache (after its first sampled token), and restore from there.
      const bool defer = options_.enable_prefix_cache && sp.n > 1;
      for (Choice& c : r->choices)
        if (c.index == 0 || !defer) admit_choice(*r, c);
      prompt_tokens += static_cast<int64_t>(r->request.prompt.size());
      if (r->open > 0) L.live.emplace(r->id, std::move(r));
    }
    if (stopping) {
      for (auto& [id, r] : L.live) cancels.push_back(id);
    }
    for (uint64_t id : cancels) {
      auto it = L.live.find(id);
      if (it == L.live.end()) continue;
      for (Choice& c : it->second->choices) {
        if (c.done) continue;
        if (c.admitted) sched.cancel(sched_id(id, c.index)).IgnoreError();
        finish_choice(*it->second, c, FinishReason::kCancelled, "");
      }
      L.live.erase(it);
    }
    if (stopping) break;
    if (!sched.has_unfinished()) {
      publish_stats();
      continue;
    }

    BatchPlan plan = sched.schedule();
    preemptions += static_cast<int64_t>(plan.preempted.size());
    StepResult result;
    absl::StatusOr<Tensor> logits =
        plan.seqs.empty() ? absl::StatusOr<Tensor>(Tensor::empty({0, vocab})) : L.runner->run(plan);
    if (!logits.ok()) {
      // A failed step is a bug (the plan was validated); fail the step's requests, keep serving.
      for (const SeqPlan& s : plan.seqs) {
        SeqResult sr;
        sr.request_id = s.request_id;
        if (s.sample) sr.token = 0;
        sr.finished = true;
        sr.reason = FinishReason::kCancelled;
        result.seqs.push_back(sr);
        auto it = L.live.find(s.request_id / kMaxN);
        if (it != L.live.end()) {
          Choice& c = it->second->choices[s.request_id % kMaxN];
          c.reason = FinishReason::kError;
          c.error = std::string(logits.status().message());
        }
      }
    } else {
      ++steps;
      int64_t row = 0;
      for (const SeqPlan& s : plan.seqs) {
        SeqResult sr;
        sr.request_id = s.request_id;
        auto it = L.live.find(s.request_id / kMaxN);
        LiveRequest* r = it == L.live.end() ? nullptr : it->second.get();
        Choice* c = r ? &r->choices[s.request_id % kMaxN] : nullptr;
        if (c != nullptr && !c->seen) {
          c->seen = true;
          query_tokens += static_cast<int64_t>(r->request.prompt.size());
          hit_tokens += s.start_pos;
        }
        if (!s.sample) {
          result.seqs.push_back(sr);
          continue;
        }
        std::span<float> row_logits(logits->data<float>() + row * vocab, vocab);
        ++row;
        if (c == nullptr || c->done) {  // cancelled meanwhile: the scheduler ignores the result
          sr.token = 0;
          result.seqs.push_back(sr);
          continue;
        }
        const SamplingParams& sp = r->request.params;
        SampledToken tok = c->sampler->sample(
            row_logits, sp, sp.ignore_eos ? std::span<const int32_t>() : L.eos_ids);
        ++c->generated;
        ++generated;
        sr.token = tok.token;
        RequestOutput out;
        out.index = c->index;
        out.token_ids.push_back(tok.token);
        if (sp.logprobs >= 0) out.logprobs.push_back({tok.token, tok.logprob, tok.top_logprobs});
        bool stop_now = false;
        const bool past_min = c->generated > sp.min_tokens;
        if (past_min && !sp.ignore_eos &&
            std::find(L.eos_ids.begin(), L.eos_ids.end(), tok.token) != L.eos_ids.end())
          stop_now = true;
        if (past_min && std::find(sp.stop_token_ids.begin(), sp.stop_token_ids.end(), tok.token) !=
                            sp.stop_token_ids.end())
          stop_now = true;
        // A stopping token (EOS, a stop id) is reported as an id but its text is not output, as
        // OpenAI and vLLM do: with a real tokenizer it would be `<|im_end|>` in the user's text.
        if (c->detok && !stop_now) {
          absl::StatusOr<std::string> piece = c->detok->push(tok.token);
          std::string text = piece.ok() ? *piece : std::string();
          if (c->stop && past_min) {
            bool stopped = false;
            out.text = c->stop->push(text, &stopped);
            stop_now |= stopped;
            c->text_ended = stopped;
          } else if (c->stop) {
            // Before min_tokens, stop strings do not apply: emit through the checker's hold-back
            // without acting on a match.
            out.text = c->stop->flush() + text;
          } else {
            out.text = std::move(text);
          }
        }
        r->stream->push(std::move(out));
        if (stop_now) {
          sr.finished = true;
          sr.reason = FinishReason::kStop;
          c->reason = FinishReason::kStop;
        }
        result.seqs.push_back(sr);
        // First token of choice 0: the prompt is now in the prefix cache; admit the siblings.
        if (c->index == 0 && c->generated == 1)
          for (Choice& sib : r->choices)
            if (!sib.admitted && !sib.done) admit_choice(*r, sib);
      }
    }
    absl::StatusOr<std::vector<FinishedRequest>> done = sched.complete(result);
    LOOM_CHECK(done.ok(), "scheduler rejected the engine's step result: %s",
               std::string(done.status().message()).c_str());
    for (const FinishedRequest& f : *done) {
      auto it = L.live.find(f.request_id / kMaxN);
      if (it == L.live.end()) continue;
      LiveRequest& r = *it->second;
      Choice& c = r.choices[f.request_id % kMaxN];
      const FinishReason reason = c.reason != FinishReason::kNone ? c.reason : f.reason;
      finish_choice(r, c, reason, c.error);
      if (r.open == 0) L.live.erase(it);
    }
    publish_stats();
  }
  publish_stats();
}

}  // namespace loom
