#include "engine/engine.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "engine/engine_inbox.h"
#include "engine/engine_loop.h"
#include "engine/session_store.h"

namespace loom {

Engine::Engine() : inbox_(std::make_unique<EngineInbox>()) {}

absl::StatusOr<std::unique_ptr<Engine>> Engine::create(std::unique_ptr<Model> model,
                                                       std::shared_ptr<const Tokenizer> tokenizer,
                                                       const EngineOptions& options) {
  if (model == nullptr) return absl::InvalidArgumentError("Engine::create: no model");
  if (options.max_num_batched_tokens < 1 || options.max_num_seqs < 1 || options.page_size < 1)
    return absl::InvalidArgumentError(
        "max_num_batched_tokens, max_num_seqs and page_size must be >= 1");
  if (options.max_sessions < 0 || !(options.session_ttl_s > 0) || options.session_max_bytes < 0 ||
      options.sessions_max_bytes < 0)
    return absl::InvalidArgumentError(
        "max_sessions, session_max_bytes and sessions_max_bytes must be >= 0 and session_ttl_s > "
        "0");
  std::unique_ptr<Engine> e(new Engine());
  e->options_ = options;
  e->sessions_ =
      std::make_unique<SessionStore>(options.max_sessions, absl::Seconds(options.session_ttl_s));
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

  e->model_ = std::move(model);
  LOOM_ASSIGN_OR_RETURN(e->loop_, EngineLoop::create(*e->model_, e->tokenizer_.get(), options,
                                                     *e->inbox_, *e->sessions_));
  e->kv_pages_ = e->loop_->kv_page_capacity();
  e->memory_plan_ = e->loop_->memory_plan();
  e->graph_capture_ = e->loop_->graph_capture();
  e->thread_ = std::thread([loop = e->loop_.get()] { loop->run(); });
  return e;
}

Engine::~Engine() { shutdown(); }

const ModelConfig& Engine::config() const { return model_->config(); }

absl::StatusOr<std::shared_ptr<RequestStream>> Engine::submit(Request request,
                                                              int64_t* session_continued) {
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
  if (request.return_routed_experts &&
      std::find(cfg.ffns.begin(), cfg.ffns.end(), FfnType::kMoe) == cfg.ffns.end())
    return absl::InvalidArgumentError(
        "return_routed_experts: the model has no MoE layers to report the routing of");
  if (!request.params.stop.empty() && tokenizer_ == nullptr)
    return absl::InvalidArgumentError("stop strings need a tokenizer; this engine has none");
  if (session_continued != nullptr) *session_continued = 0;
  if (request.session.empty()) {
    LOOM_RETURN_IF_ERROR(check_length(request));
    return inbox_->push(std::move(request));
  }
  if (request.params.n != 1)
    return absl::InvalidArgumentError("a session turn generates one choice (n must be 1)");
  // The turn holds the session from here: every refusal below gives it back.
  LOOM_ASSIGN_OR_RETURN(SessionStore::Turn turn,
                        sessions_->begin_turn(request.session, request.prompt, absl::Now(),
                                              request.session_whole_prompt));
  if (turn.dropped != 0) inbox_->drop_session(turn.dropped);  // its kept cache is not this prompt's
  if (session_continued != nullptr) *session_continued = turn.continued;
  request.prompt = std::move(turn.prompt);
  absl::Status length = check_length(request);
  if (!length.ok()) {
    sessions_->abort_turn(turn.key);
    return absl::Status(length.code(),
                        absl::StrCat("session '", request.session,
                                     "': its history and the new tokens: ", length.message()));
  }
  absl::StatusOr<std::shared_ptr<RequestStream>> stream =
      inbox_->push(std::move(request), turn.key);
  if (!stream.ok()) sessions_->abort_turn(turn.key);
  return stream;
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
  LOOM_ASSIGN_OR_RETURN(uint64_t key, sessions_->erase(name));
  inbox_->drop_session(key);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Engine::update_weights(const ParameterArena& source) {
  const ParameterArena& target = model_->parameters();
  // Host parameters of a served model are read-only pages after the load (a stray write
  // faults); only a model loaded trainable keeps them writable.
  if (target.device().is_cpu() && !model_->placement().trainable)
    return absl::FailedPreconditionError(
        "update_weights: the engine's model was loaded with read-only parameters; load it with "
        "Placement::trainable to update its weights in place");
  // Checked in full before anything is written, so a mismatch leaves the model as it was.
  std::vector<std::pair<Tensor, Tensor>> copies;  // (engine parameter, source)
  copies.reserve(target.entries().size());
  for (const ParameterArena::Entry& e : target.entries()) {
    const Tensor* src = source.find(e.name);
    if (src == nullptr)
      return absl::InvalidArgumentError(
          absl::StrCat("update_weights: the source has no parameter '", e.name, "'"));
    if (!(src->shape() == e.tensor.shape()) || src->dtype() != e.tensor.dtype())
      return absl::InvalidArgumentError(absl::StrCat("update_weights: parameter '", e.name, "' is ",
                                                     e.tensor.describe(), " in the engine but ",
                                                     src->describe(), " in the source"));
    copies.emplace_back(e.tensor, *src);
  }
  EngineInbox::WeightUpdate update;
  update.copy = [&copies] {
    for (const auto& [dst, src] : copies) dst.copy_from(src);
  };
  inbox_->push_weight_update(&update);
  update.done.WaitForNotification();
  if (!update.result.ok()) return update.result;
  return update.version;
}

void Engine::cancel(uint64_t request_id) { inbox_->cancel(request_id); }

void Engine::shutdown() {
  inbox_->stop();
  if (thread_.joinable()) thread_.join();
}

void Engine::wait_idle() { inbox_->wait_idle(); }

EngineStats Engine::stats() const {
  EngineStats s = inbox_->stats();
  const SessionStore::Stats ss = sessions_->stats();
  s.sessions = ss.sessions;
  s.session_history_tokens = ss.history_tokens;
  s.sessions_expired = ss.expired;
  return s;
}

}  // namespace loom
