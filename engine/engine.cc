#include "engine/engine.h"

#include <omp.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "core/status.h"
#include "engine/engine_inbox.h"
#include "engine/engine_loop.h"
#include "engine/expert_parallel_ranks.h"
#include "engine/session_store.h"
#include "kernels/elementwise.h"
#include "kernels/exec.h"

namespace loom {

absl::Status Engine::init(const Model& model, std::shared_ptr<const Tokenizer> tokenizer,
                          const EngineOptions& options) {
  if (options.max_num_batched_tokens < 1 || options.max_num_seqs < 1 || options.page_size < 1)
    return absl::InvalidArgumentError(
        "max_num_batched_tokens, max_num_seqs and page_size must be >= 1");
  if (options.max_sessions < 0 || !(options.session_ttl_s > 0) || options.session_max_bytes < 0 ||
      options.sessions_max_bytes < 0)
    return absl::InvalidArgumentError(
        "max_sessions, session_max_bytes and sessions_max_bytes must be >= 0 and session_ttl_s > "
        "0");
  if (options.session_offload_bytes < 0 || options.session_offload_disk_bytes < 0 ||
      options.prefix_offload_bytes < 0)
    return absl::InvalidArgumentError(
        "session_offload_bytes, session_offload_disk_bytes and prefix_offload_bytes must be >= 0");
  if (!options.session_offload_dir.empty() && options.session_offload_bytes == 0)
    return absl::InvalidArgumentError(
        "session_offload_dir is the disk tier below the host tier: it needs "
        "session_offload_bytes > 0");
  options_ = options;
  tokenizer_ = std::move(tokenizer);
  const ModelConfig& cfg = model.config();
  max_model_len_ = options.max_model_len > 0         ? options.max_model_len
                   : cfg.max_position_embeddings > 0 ? cfg.max_position_embeddings
                                                     : (1 << 30);
  // Ids past the model's embedding can never be sampled, and prompts holding them are refused per
  // request; only special tokens may lie there (Kimi's tokenizers reserve 258 special ids while
  // Kimi-K2's embedding covers 256 of them). A regular token there means a mismatched tokenizer.
  if (tokenizer_) {
    for (int32_t id = cfg.vocab_size; id < tokenizer_->vocab_size(); ++id) {
      if (!tokenizer_->is_special(id))
        return absl::InvalidArgumentError(absl::StrCat(
            "the tokenizer has ", tokenizer_->vocab_size(), " tokens but the model only ",
            cfg.vocab_size, ", and token ", id, " past the model's is not a special token"));
    }
  }
  return absl::OkStatus();
}

absl::Status Engine::add_rank(std::unique_ptr<Model> model, int size, const EngineRankLink* link) {
  const int r = static_cast<int>(ranks_.size());
  auto rank = std::make_unique<Rank>();
  rank->model = std::move(model);
  rank->inbox = std::make_unique<EngineInbox>(r + 1, size);
  rank->sessions =
      std::make_unique<SessionStore>(options_.max_sessions, absl::Seconds(options_.session_ttl_s));
  LOOM_ASSIGN_OR_RETURN(rank->loop, EngineLoop::create(*rank->model, tokenizer_.get(), options_,
                                                       *rank->inbox, *rank->sessions, link));
  if (r == 0) {
    kv_pages_ = rank->loop->kv_page_capacity();
    memory_plan_ = rank->loop->memory_plan();
    graph_capture_ = rank->loop->graph_capture();
  }
  ranks_.push_back(std::move(rank));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::create(std::unique_ptr<Model> model,
                                                       std::shared_ptr<const Tokenizer> tokenizer,
                                                       const EngineOptions& options) {
  if (model == nullptr) return absl::InvalidArgumentError("Engine::create: no model");
  std::unique_ptr<Engine> e(new Engine());
  LOOM_RETURN_IF_ERROR(e->init(*model, std::move(tokenizer), options));
  LOOM_RETURN_IF_ERROR(e->add_rank(std::move(model), 1, nullptr));
  Rank& rank = *e->ranks_[0];
  rank.thread = std::thread([loop = rank.loop.get()] { loop->run(); });
  return e;
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::create_expert_parallel(
    std::unique_ptr<ExpertParallelRanks> ranks, std::shared_ptr<const Tokenizer> tokenizer,
    const EngineOptions& options) {
  if (ranks == nullptr || ranks->size() < 1)
    return absl::InvalidArgumentError("Engine::create_expert_parallel: no ranks");
  std::unique_ptr<Engine> e(new Engine());
  e->expert_parallel_ = std::move(ranks);
  ExpertParallelRanks& ep = *e->expert_parallel_;
  for (int r = 0; r < ep.size(); ++r) {
    std::unique_ptr<Model> model = ep.take_model(r);
    if (model == nullptr)
      return absl::InvalidArgumentError(absl::StrCat("expert-parallel rank ", r, " has no model"));
    if (r == 0) LOOM_RETURN_IF_ERROR(e->init(*model, tokenizer, options));
    LOOM_RETURN_IF_ERROR(e->add_rank(std::move(model), ep.size(), &ep.link(r)));
  }
  const int threads = ep.threads_per_rank();
  for (auto& rank : e->ranks_)
    rank->thread = std::thread([loop = rank->loop.get(), threads] {
      // Each rank an equal share of the cores: ranks that each spread over all of them would
      // oversubscribe them (and the OpenMP OpenBLAS rounds with its thread count).
      omp_set_num_threads(threads);
      loop->run();
    });
  return e;
}

Engine::~Engine() { shutdown(); }

const ModelConfig& Engine::config() const { return ranks_[0]->model->config(); }

absl::StatusOr<std::shared_ptr<RequestStream>> Engine::submit(Request request,
                                                              int64_t* session_continued) {
  const ModelConfig& cfg = config();
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
  if (request.return_routed_experts &&
      std::find(cfg.ffns.begin(), cfg.ffns.end(), FfnType::kMoe) == cfg.ffns.end())
    return absl::InvalidArgumentError(
        "return_routed_experts: the model has no MoE layers to report the routing of");
  if (!request.params.stop.empty() && tokenizer_ == nullptr)
    return absl::InvalidArgumentError("stop strings need a tokenizer; this engine has none");
  if (session_continued != nullptr) *session_continued = 0;
  // A failed rank group refuses at once (its loops close their inboxes when they next pass).
  if (expert_parallel_ != nullptr) {
    if (absl::Status group = expert_parallel_->status(); !group.ok())
      return absl::Status(group.code(),
                          absl::StrCat("expert-parallel ranks failed: ", group.message()));
  }
  if (request.session.empty()) {
    LOOM_RETURN_IF_ERROR(check_length(request));
    const int r = least_loaded_rank();
    absl::StatusOr<std::shared_ptr<RequestStream>> stream =
        ranks_[r]->inbox->push(std::move(request));
    if (stream.ok()) wake_others(r);
    return stream;
  }
  if (request.params.n != 1)
    return absl::InvalidArgumentError("a session turn generates one choice (n must be 1)");
  if (ranks_.size() == 1) return submit_turn(*ranks_[0], std::move(request), session_continued);
  // A session lives on one rank (its history and kept cache are that rank's); a new one goes
  // where the least is queued and running, while all ranks together keep at most max_sessions.
  absl::MutexLock lock(&placing_);
  int r = -1;
  int64_t sessions = 0;
  for (size_t q = 0; q < ranks_.size(); ++q) {
    if (ranks_[q]->sessions->contains(request.session)) r = static_cast<int>(q);
    sessions += ranks_[q]->sessions->stats().sessions;
  }
  if (r < 0) {
    if (sessions >= options_.max_sessions)
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot start session '", request.session, "': this server keeps at most ",
          options_.max_sessions, " sessions; delete one or wait for idle ones to expire"));
    r = least_loaded_rank();
  }
  absl::StatusOr<std::shared_ptr<RequestStream>> stream =
      submit_turn(*ranks_[r], std::move(request), session_continued);
  if (stream.ok()) wake_others(r);
  return stream;
}

absl::StatusOr<std::shared_ptr<RequestStream>> Engine::submit_turn(Rank& rank, Request request,
                                                                   int64_t* session_continued) {
  // The turn holds the session from here: every refusal below gives it back.
  LOOM_ASSIGN_OR_RETURN(SessionStore::Turn turn,
                        rank.sessions->begin_turn(request.session, request.prompt, absl::Now(),
                                                  request.session_whole_prompt));
  // Its kept cache is not this prompt's.
  if (turn.dropped != 0) rank.inbox->drop_session(turn.dropped);
  if (session_continued != nullptr) *session_continued = turn.continued;
  request.prompt = std::move(turn.prompt);
  absl::Status length = check_length(request);
  if (!length.ok()) {
    rank.sessions->abort_turn(turn.key);
    return absl::Status(length.code(),
                        absl::StrCat("session '", request.session,
                                     "': its history and the new tokens: ", length.message()));
  }
  absl::StatusOr<std::shared_ptr<RequestStream>> stream =
      rank.inbox->push(std::move(request), turn.key, turn.continued);
  if (!stream.ok()) rank.sessions->abort_turn(turn.key);
  return stream;
}

int Engine::least_loaded_rank() const {
  int best = 0;
  int64_t best_load = ranks_[0]->inbox->load_tokens();
  for (size_t r = 1; r < ranks_.size(); ++r) {
    const int64_t load = ranks_[r]->inbox->load_tokens();
    if (load < best_load) {
      best = static_cast<int>(r);
      best_load = load;
    }
  }
  return best;
}

void Engine::wake_others(int r) {
  for (size_t q = 0; q < ranks_.size(); ++q)
    if (static_cast<int>(q) != r) ranks_[q]->inbox->wake();
}

absl::Status Engine::check_length(const Request& request) const {
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
  return absl::OkStatus();
}

absl::Status Engine::delete_session(const std::string& name) {
  absl::MutexLock lock(&placing_);
  for (auto& rank : ranks_) {
    if (!rank->sessions->contains(name)) continue;
    LOOM_ASSIGN_OR_RETURN(uint64_t key, rank->sessions->erase(name));
    rank->inbox->drop_session(key);
    return absl::OkStatus();
  }
  // The store's own NotFound.
  return ranks_[0]->sessions->erase(name).status();
}

namespace {

// One parameter of a weight update, `src` into `dst` (same shape; the same dtype, or f32 into bf16
// rounded to nearest even as the loader rounds a checkpoint into bf16 matrices). Synchronous: the
// engine's next step and the trainer's next change of `src` come after it.
void copy_parameter(const Tensor& dst, const Tensor& src) {
  if (dst.dtype() == src.dtype()) {
    dst.copy_from(src);
    return;
  }
  const int64_t n = dst.numel();
  if (!dst.device().is_cpu() && src.device() == dst.device()) {
    // The converting column copy (kernels/elementwise.h: bf16 stores round to nearest even).
    const Exec ex = exec_for(dst.device());
    copy_columns(ex, src.reshape({1, n}), 0, dst.reshape({1, n}));
    synchronize(ex);
    return;
  }
  // Across devices: converted on the host, then copied to wherever the engine's parameter lives.
  const Tensor host = src.to(Device::kCpu);
  const Tensor out = dst.device().is_cpu() ? dst : Tensor::empty(dst.shape(), DType::kBF16);
  const float* in = host.data<float>();
  uint16_t* o = out.data<uint16_t>();
  for (int64_t i = 0; i < n; ++i) o[i] = f32_to_bf16(in[i]);
  if (!dst.device().is_cpu()) dst.copy_from(out);
}

}  // namespace

absl::StatusOr<int64_t> Engine::update_weights(const ParameterArena& source) {
  if (ranks_.size() > 1)
    return absl::FailedPreconditionError(
        "update_weights: not with expert parallelism (each rank holds only its experts)");
  const Model& model = *ranks_[0]->model;
  const ParameterArena& target = model.parameters();
  // Host parameters of a served model are read-only pages after the load (a stray write
  // faults); only a model loaded trainable or writable keeps them writable.
  if (target.device().is_cpu() && !model.placement().trainable && !model.placement().writable)
    return absl::FailedPreconditionError(
        "update_weights: the engine's model was loaded with read-only parameters; load it with "
        "Placement::trainable or Placement::writable to update its weights in place");
  // Checked in full before anything is written, so a mismatch leaves the model as it was.
  std::vector<std::pair<Tensor, Tensor>> copies;  // (engine parameter, source)
  copies.reserve(target.entries().size());
  for (const ParameterArena::Entry& e : target.entries()) {
    const Tensor* src = source.find(e.name);
    if (src == nullptr)
      return absl::InvalidArgumentError(
          absl::StrCat("update_weights: the source has no parameter '", e.name, "'"));
    if (!(src->shape() == e.tensor.shape()))
      return absl::InvalidArgumentError(absl::StrCat("update_weights: parameter '", e.name, "' is ",
                                                     e.tensor.describe(), " in the engine but ",
                                                     src->describe(), " in the source"));
    if (src->dtype() != e.tensor.dtype() &&
        !(src->dtype() == DType::kF32 && e.tensor.dtype() == DType::kBF16))
      return absl::InvalidArgumentError(absl::StrCat(
          "update_weights: parameter '", e.name, "' is ", e.tensor.describe(),
          " in the engine but ", src->describe(), " in the source; ",
          e.tensor.dtype() == DType::kF8E4M3
              ? "FP8 engine weights would need re-quantization (block scales), which the weight "
                "sync does not do: load the engine's model with f32 or bf16 weights"
              : "only the same dtype or f32 into bf16 (rounded to nearest even) is converted"));
    copies.emplace_back(e.tensor, *src);
  }
  EngineInbox::WeightUpdate update;
  update.copy = [&copies] {
    for (const auto& [dst, src] : copies) copy_parameter(dst, src);
  };
  ranks_[0]->inbox->push_weight_update(&update);
  update.done.WaitForNotification();
  if (!update.result.ok()) return update.result;
  return update.version;
}

void Engine::cancel(uint64_t request_id) {
  // Rank r's ids are r + 1 + k N (add_rank).
  if (request_id == 0) return;
  ranks_[(request_id - 1) % ranks_.size()]->inbox->cancel(request_id);
}

void Engine::shutdown() {
  for (auto& rank : ranks_) rank->inbox->stop();
  for (auto& rank : ranks_)
    if (rank->thread.joinable()) rank->thread.join();
}

void Engine::wait_idle() {
  for (auto& rank : ranks_) rank->inbox->wait_idle();
}

std::vector<EngineStats> Engine::rank_stats() const {
  std::vector<EngineStats> out;
  for (const auto& rank : ranks_) {
    EngineStats s = rank->inbox->stats();
    const SessionStore::Stats ss = rank->sessions->stats();
    s.sessions = ss.sessions;
    s.session_history_tokens = ss.history_tokens;
    s.sessions_expired = ss.expired;
    out.push_back(s);
  }
  return out;
}

EngineStats Engine::stats() const {
  const std::vector<EngineStats> ranks = rank_stats();
  if (ranks.size() == 1) return ranks[0];
  // Counters and gauges add up over the ranks; the weight version is every rank's.
  EngineStats s;
  for (const EngineStats& r : ranks) {
    s.waiting += r.waiting;
    s.running += r.running;
    s.pages_total += r.pages_total;
    s.pages_free += r.pages_free;
    s.slots_total += r.slots_total;
    s.slots_free += r.slots_free;
    s.steps = std::max(s.steps, r.steps);  // lockstep: the ranks step together
    s.prompt_tokens += r.prompt_tokens;
    s.generated_tokens += r.generated_tokens;
    s.preemptions += r.preemptions;
    s.prefix_hit_tokens += r.prefix_hit_tokens;
    s.prefix_query_tokens += r.prefix_query_tokens;
    s.finished_stop += r.finished_stop;
    s.finished_length += r.finished_length;
    s.finished_cancelled += r.finished_cancelled;
    s.finished_error += r.finished_error;
    s.sessions += r.sessions;
    s.sessions_resident += r.sessions_resident;
    s.session_history_tokens += r.session_history_tokens;
    s.session_pages += r.session_pages;
    s.session_slots += r.session_slots;
    s.session_bytes += r.session_bytes;
    s.session_evictions += r.session_evictions;
    s.sessions_expired += r.sessions_expired;
    s.prefix_offload_bytes += r.prefix_offload_bytes;
    s.prefix_offloads += r.prefix_offloads;
    s.prefix_offload_hits += r.prefix_offload_hits;
    s.prefix_restored_pages += r.prefix_restored_pages;
    s.prefix_restored_checkpoints += r.prefix_restored_checkpoints;
    s.prefix_offload_lost += r.prefix_offload_lost;
    s.weight_version = r.weight_version;
    s.weight_updates = r.weight_updates;
    merge(s.device_clock, r.device_clock);
  }
  return s;
}

std::optional<double> Engine::expert_load_balance() const {
  return expert_parallel_ ? expert_parallel_->load_balance() : std::nullopt;
}

int64_t Engine::expert_replacements() const {
  return expert_parallel_ ? expert_parallel_->replacements() : 0;
}

absl::Status Engine::rank_group_status() const {
  return expert_parallel_ ? expert_parallel_->status() : absl::OkStatus();
}

int Engine::first_rank() const { return expert_parallel_ ? expert_parallel_->first_rank() : 0; }

int64_t Engine::rank_load_tokens(int r) const { return ranks_.at(r)->inbox->load_tokens(); }

}  // namespace loom
