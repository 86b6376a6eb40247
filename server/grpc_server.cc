// The gRPC frontend on gRPC's callback API.
//
// Threads. gRPC's own callback executor runs the handlers (unary calls finish inline; Generate
// only validates and submits) and the reactions (OnWriteDone, OnCancel, OnDone). One pump thread
// of ours moves engine events to the client: it scans the live streams that have no write in
// flight, pops what is ready without blocking, and starts their writes; when nothing was ready it
// sleeps on a Doorbell that the engine rings after every event of a live stream
// (RequestStream::set_on_ready) and the reactions ring on a new call, a finished write or a
// cancel. So an idle or slow stream holds no thread, a token goes out as soon as it is sampled,
// and nothing polls.
//
// Lifetime. Each Generate call is a GenerateReactor owned by gRPC (deleted in OnDone). Only the
// pump calls StartWrite and Finish, and it unregisters a reactor (under mu_) before Finish, so no
// other thread touches a reactor that gRPC may delete. OnCancel (client cancel, deadline, lost
// connection) cancels the request in the engine at once; its pages and slot are freed at the
// engine's next step, whether or not we drain the stream.
//
// The rules both frontends obey (server/admission.h). Every method but grpc.health.v1 needs the
// API key: AuthInterceptor refuses the call with UNAUTHENTICATED before any handler sees it, which
// also covers server reflection (a service we do not implement); our own handlers check again so
// that a refused call does no work. Generate takes an AdmissionGate ticket (--max_queue) before it
// submits, and releases it when its stream finishes. The drain is begin_drain() (health
// NOT_SERVING, new calls UNAVAILABLE) then, after loom-server's --drain_timeout_s, shutdown().
//
// The Loom methods are registered raw (ByteBuffer in and out) and parse their own requests: with
// typed callback handlers gRPC answers a request that does not parse with UNIMPLEMENTED, while
// the client's mistake is INVALID_ARGUMENT.
#include "server/grpc_server.h"

#include <chrono>
#include <list>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/status.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/support/server_interceptor.h"
#include "loom/v1/loom.grpc.pb.h"
#include "server/admission.h"
#include "server/doorbell.h"
#include "server/grpc_convert.h"
#include "server/metrics.h"

namespace loom {
namespace {

// How long shutdown() lets clients take the final status of their ended streams before gRPC
// cancels the calls (a client that stopped reading): the process must exit promptly after the
// drain timeout.
constexpr auto kShutdownGrace = std::chrono::milliseconds(500);

constexpr char kAuthError[] = "missing or wrong API key (metadata authorization: Bearer ...)";
constexpr char kShuttingDown[] = "the server is shutting down";

using Metadata = std::multimap<grpc::string_ref, grpc::string_ref>;

double seconds_since(absl::Time t) { return absl::ToDoubleSeconds(absl::Now() - t); }

bool authorized(const Metadata& metadata, const std::string& api_key) {
  if (api_key.empty()) return true;
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return false;
  return api_key_matches(std::string_view(it->second.data(), it->second.size()), api_key);
}

// Refuses a call without the key before any handler (ours, reflection's) runs: cancelling the
// call with a status sends that status to the client at once.
class AuthInterceptor final : public grpc::experimental::Interceptor {
 public:
  AuthInterceptor(grpc::experimental::ServerRpcInfo* info, const std::string& api_key)
      : info_(info), api_key_(api_key) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::POST_RECV_INITIAL_METADATA) &&
        !authorized(*methods->GetRecvInitialMetadata(), api_key_)) {
      grpc_call_cancel_with_status(info_->server_context()->c_call(), GRPC_STATUS_UNAUTHENTICATED,
                                   kAuthError, nullptr);
    }
    methods->Proceed();
  }

 private:
  grpc::experimental::ServerRpcInfo* const info_;
  const std::string& api_key_;  // the factory's, which the server owns
};

class AuthInterceptorFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit AuthInterceptorFactory(std::string api_key) : api_key_(std::move(api_key)) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    // Health stays open, as HTTP's /health does: supervisors probe without credentials.
    if (absl::StartsWith(info->method(), "/grpc.health.v1.Health/")) return nullptr;
    return new AuthInterceptor(info, api_key_);
  }

 private:
  const std::string api_key_;
};

// A request message from the wire. INVALID_ARGUMENT when it does not parse.
template <class Message>
grpc::Status parse_request(const grpc::ByteBuffer* in, Message* message) {
  grpc::ByteBuffer copy;  // Deserialize consumes its buffer; `in` is gRPC's
  if (in != nullptr && in->Valid()) copy = *in;
  if (in == nullptr || !in->Valid() ||
      !grpc::SerializationTraits<Message>::Deserialize(&copy, message).ok()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("the request is not a valid ",
                                     Message::descriptor()->full_name(), " message"));
  }
  return grpc::Status::OK;
}

template <class Message>
grpc::Status serialize_response(const Message& message, grpc::ByteBuffer* out) {
  out->Clear();  // gRPC's writer asserts an empty buffer (reactors reuse theirs)
  bool own_buffer = false;
  return grpc::SerializationTraits<Message>::Serialize(message, out, &own_buffer);
}

// The metrics label of a refused call (HTTP's status for the same refusal).
const char* rejection_label(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::UNAUTHENTICATED:
      return "401";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "429";
    case grpc::StatusCode::UNAVAILABLE:
      return "503";
    default:
      return "400";
  }
}

using RawLoomService =
    v1::Loom::WithRawCallbackMethod_Generate<v1::Loom::WithRawCallbackMethod_Tokenize<
        v1::Loom::WithRawCallbackMethod_Detokenize<v1::Loom::WithRawCallbackMethod_GetModelInfo<
            v1::Loom::WithRawCallbackMethod_GetStats<v1::Loom::Service>>>>>;

}  // namespace

class GenerateReactor;

struct GrpcServer::Impl final : public RawLoomService {
  Impl(Engine& e, std::shared_ptr<const Tokenizer> tok, std::string name, Metrics* m,
       const GrpcServerOptions& options)
      : engine(e),
        tokenizer(std::move(tok)),
        model_name(std::move(name)),
        metrics(m),
        api_key(options.api_key),
        own_gate(options.admission
                     ? nullptr
                     : std::make_unique<AdmissionGate>(options.max_running, options.max_queue)),
        gate(options.admission ? options.admission : own_gate.get()) {}

  // The Loom service, raw (see the top of this file).
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* ctx,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;

  // What every call passes first: the key (UNAUTHENTICATED), then the drain (UNAVAILABLE).
  grpc::Status admit_call(const grpc::CallbackServerContext& ctx);
  // A unary method: admit_call, parse the request, `handle` it (a grpc::Status), serialize.
  template <class Req, class Resp, class Handle>
  grpc::ServerUnaryReactor* unary(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                  grpc::ByteBuffer* out, Handle handle);

  void pump_loop();
  void wake() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { bell->ring(); }

  // Constant after start().
  Engine& engine;
  const std::shared_ptr<const Tokenizer> tokenizer;
  const std::string model_name;
  Metrics* const metrics;
  const std::string api_key;
  const std::unique_ptr<AdmissionGate> own_gate;  // when the options bring none
  AdmissionGate* const gate;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  std::thread pump;

  absl::Mutex mu;
  std::list<GenerateReactor*> live ABSL_GUARDED_BY(mu);  // registered, not yet finished
  bool draining ABSL_GUARDED_BY(mu) = false;
  bool stop_pump ABSL_GUARDED_BY(mu) = false;
  const std::shared_ptr<Doorbell> bell = std::make_shared<Doorbell>();  // the pump sleeps on it
  absl::Mutex shutdown_mu;                                              // serializes shutdown()
  bool shut_down ABSL_GUARDED_BY(shutdown_mu) = false;
};

// One Generate call. Fields marked (mu) are guarded by Impl::mu; (pump) are touched only by the
// pump thread once the reactor is registered.
class GenerateReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  GenerateReactor(GrpcServer::Impl& s, std::shared_ptr<RequestStream> stream, absl::Time received,
                  AdmissionGate::Ticket ticket)
      : s_(s),
        stream_(std::move(stream)),
        received_(received),
        ticket_(std::move(ticket)),
        last_token_(received) {}

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&s_.mu);
    write_in_flight_ = false;
    if (!ok && !cancelled_) cancel_locked();  // the client is gone
    s_.wake();
  }
  void OnCancel() override {
    absl::MutexLock lock(&s_.mu);
    if (!cancelled_) cancel_locked();
    s_.wake();
  }
  void OnDone() override { delete this; }

  // Pump side, under s_.mu: what to do next for this call. kWrite: resp_ holds the next message
  // (start_write()); kFinish: finish_status_ is set (finish()). The pump makes those gRPC calls
  // after releasing s_.mu.
  enum class Action { kNone, kWrite, kFinish };
  Action poll_locked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu) {
    if (write_in_flight_) return Action::kNone;
    if (cancelled_) {
      finish_status_ = cancel_status_;
      return Action::kFinish;
    }
    std::optional<RequestOutput> ev = stream_->next(absl::ZeroDuration());
    if (!ev) {
      if (!stream_->closed()) return Action::kNone;
      finish_status_ =
          error_.empty() ? grpc::Status::OK : grpc::Status(grpc::StatusCode::INTERNAL, error_);
      return Action::kFinish;
    }
    observe(*ev);
    response_from_output(*ev, &resp_);
    if (grpc::Status st = serialize_response(resp_, &out_); !st.ok()) {
      cancel_locked();
      finish_status_ = st;
      return Action::kFinish;
    }
    write_in_flight_ = true;
    return Action::kWrite;
  }
  void start_write() { StartWrite(&out_); }
  void finish() { Finish(finish_status_); }  // may delete this

  // The drain timeout passed: ends the call with UNAVAILABLE and cancels the request (under mu).
  void drain_locked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu) {
    if (cancelled_) return;
    cancel_locked();
    cancel_status_ =
        grpc::Status(grpc::StatusCode::UNAVAILABLE,
                     absl::StrCat(kShuttingDown, ": the drain timeout ended this stream after ",
                                  completion_tokens_, " tokens"));
  }

 private:
  void cancel_locked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu) {
    cancelled_ = true;
    s_.engine.cancel(stream_->id());
    if (s_.metrics && !reported_) {
      reported_ = true;
      s_.metrics->on_request_finished("cancelled", prompt_tokens_, completion_tokens_);
      s_.metrics->observe_e2e(seconds_since(received_));
    }
  }
  // Metrics of one event (pump, under mu).
  void observe(const RequestOutput& ev) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu) {
    completion_tokens_ += static_cast<int>(ev.token_ids.size());
    if (ev.finish && *ev.finish == FinishReason::kError && error_.empty())
      error_ = ev.error.empty() ? "the engine failed the request" : ev.error;
    if (ev.finish) {
      prompt_tokens_ = ev.prompt_tokens;
      last_reason_ = *ev.finish;
    }
    if (!s_.metrics) return;
    if (!ev.token_ids.empty()) {
      const absl::Time now = absl::Now();
      if (!first_token_seen_) {
        first_token_seen_ = true;
        s_.metrics->observe_ttft(absl::ToDoubleSeconds(now - received_));
      } else {
        const double gap = absl::ToDoubleSeconds(now - last_token_) / ev.token_ids.size();
        for (size_t i = 0; i < ev.token_ids.size(); ++i) s_.metrics->observe_itl(gap);
      }
      last_token_ = now;
    }
  }

 public:
  // Reports the request to metrics once and gives its admission back, at the end (pump, under mu).
  void report_locked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu) {
    ticket_.reset();
    if (!s_.metrics || reported_) return;
    reported_ = true;
    // Metrics counts cancellations under its own label, "cancelled" (what cancel_locked() and the
    // HTTP frontend's disconnects report), not OpenAI's "abort".
    const std::string_view reason =
        last_reason_ == FinishReason::kCancelled ? "cancelled" : finish_reason_name(last_reason_);
    s_.metrics->on_request_finished(reason, prompt_tokens_, completion_tokens_);
    s_.metrics->observe_e2e(seconds_since(received_));
  }

 private:
  GrpcServer::Impl& s_;
  const std::shared_ptr<RequestStream> stream_;
  const absl::Time received_;
  AdmissionGate::Ticket ticket_;  // (mu) held until the stream finishes
  v1::GenerateResponse resp_;     // (pump) the message being written
  grpc::ByteBuffer out_;          // (pump) resp_ serialized
  grpc::Status finish_status_;    // (pump)
  bool write_in_flight_ = false;  // (mu)
  bool cancelled_ = false;        // (mu)
  grpc::Status cancel_status_{grpc::StatusCode::CANCELLED, "cancelled"};  // (mu)
  bool reported_ = false;                                                 // (mu)
  std::string error_;                               // (mu) the first choice error
  bool first_token_seen_ = false;                   // (mu)
  absl::Time last_token_;                           // (mu)
  int prompt_tokens_ = 0, completion_tokens_ = 0;   // (mu)
  FinishReason last_reason_ = FinishReason::kNone;  // (mu)
};

grpc::Status GrpcServer::Impl::admit_call(const grpc::CallbackServerContext& ctx) {
  if (!authorized(ctx.client_metadata(), api_key))
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, kAuthError);
  absl::MutexLock lock(&mu);
  if (draining) return grpc::Status(grpc::StatusCode::UNAVAILABLE, kShuttingDown);
  return grpc::Status::OK;
}

template <class Req, class Resp, class Handle>
grpc::ServerUnaryReactor* GrpcServer::Impl::unary(grpc::CallbackServerContext* ctx,
                                                  const grpc::ByteBuffer* in, grpc::ByteBuffer* out,
                                                  Handle handle) {
  Req request;
  Resp response;
  grpc::Status st = admit_call(*ctx);
  if (st.ok()) st = parse_request(in, &request);
  if (st.ok()) st = to_grpc_status(check_no_unknown_fields(request));
  if (st.ok()) st = handle(request, &response);
  if (st.ok()) st = serialize_response(response, out);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(st);
  return reactor;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* GrpcServer::Impl::Generate(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in) {
  const absl::Time received = absl::Now();
  auto reject = [&](const grpc::Status& status) {
    struct Rejected final : grpc::ServerWriteReactor<grpc::ByteBuffer> {
      explicit Rejected(const grpc::Status& st) { Finish(st); }
      void OnDone() override { delete this; }
    };
    if (metrics) metrics->on_request_rejected(rejection_label(status.error_code()));
    return new Rejected(status);
  };
  if (grpc::Status st = admit_call(*ctx); !st.ok()) return reject(st);
  v1::GenerateRequest request;
  if (grpc::Status st = parse_request(in, &request); !st.ok()) return reject(st);
  absl::StatusOr<Request> r = request_from_proto(
      request, tokenizer.get(), engine.config().vocab_size, engine.max_model_len());
  if (!r.ok()) return reject(to_grpc_status(r.status()));
  if (r->tag.empty()) r->tag = absl::StrCat("grpc:", ctx->peer());
  AdmissionGate::Ticket ticket;
  if (absl::Status st = gate->try_acquire(1, &ticket); !st.ok()) return reject(to_grpc_status(st));
  absl::StatusOr<std::shared_ptr<RequestStream>> stream = engine.submit(*std::move(r));
  if (!stream.ok()) {
    if (absl::IsFailedPrecondition(stream.status()))  // the engine was shut down
      return reject(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the engine is shutting down"));
    return reject(to_grpc_status(stream.status()));
  }
  (*stream)->set_on_ready([b = bell] { b->ring(); });
  const uint64_t id = (*stream)->id();
  {
    absl::MutexLock lock(&mu);
    if (!stop_pump) {
      auto* reactor = new GenerateReactor(*this, *std::move(stream), received, std::move(ticket));
      live.push_back(reactor);
      wake();
      return reactor;
    }
  }
  // shutdown() got past its drain while we submitted: no pump would serve this call.
  engine.cancel(id);
  return reject(grpc::Status(grpc::StatusCode::UNAVAILABLE, kShuttingDown));
}

grpc::ServerUnaryReactor* GrpcServer::Impl::Tokenize(grpc::CallbackServerContext* ctx,
                                                     const grpc::ByteBuffer* in,
                                                     grpc::ByteBuffer* out) {
  return unary<v1::TokenizeRequest, v1::TokenizeResponse>(
      ctx, in, out, [this](const v1::TokenizeRequest& request, v1::TokenizeResponse* response) {
        if (!tokenizer) {
          return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                              "this model is served without a tokenizer");
        }
        std::vector<int32_t> ids =
            tokenizer->encode(request.text(), request.parse_special_tokens());
        response->mutable_token_ids()->Add(ids.begin(), ids.end());
        return grpc::Status::OK;
      });
}

grpc::ServerUnaryReactor* GrpcServer::Impl::Detokenize(grpc::CallbackServerContext* ctx,
                                                       const grpc::ByteBuffer* in,
                                                       grpc::ByteBuffer* out) {
  return unary<v1::DetokenizeRequest, v1::DetokenizeResponse>(
      ctx, in, out, [this](const v1::DetokenizeRequest& request, v1::DetokenizeResponse* response) {
        if (!tokenizer) {
          return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                              "this model is served without a tokenizer");
        }
        std::vector<int32_t> ids(request.token_ids().begin(), request.token_ids().end());
        absl::StatusOr<std::string> text = tokenizer->decode(ids, request.skip_special_tokens());
        if (!text.ok()) {
          return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                              absl::StrCat("token_ids: ", text.status().message()));
        }
        response->set_text(*std::move(text));
        return grpc::Status::OK;
      });
}

grpc::ServerUnaryReactor* GrpcServer::Impl::GetModelInfo(grpc::CallbackServerContext* ctx,
                                                         const grpc::ByteBuffer* in,
                                                         grpc::ByteBuffer* out) {
  return unary<v1::GetModelInfoRequest, v1::GetModelInfoResponse>(
      ctx, in, out, [this](const v1::GetModelInfoRequest&, v1::GetModelInfoResponse* response) {
        const ModelConfig& c = engine.config();
        response->set_model_name(model_name);
        response->set_model_type(c.model_type);
        response->set_vocab_size(c.vocab_size);
        response->set_tokenizer_vocab_size(tokenizer ? tokenizer->vocab_size() : 0);
        response->set_max_model_len(engine.max_model_len());
        response->set_eos_token_id(c.eos_token_id);
        response->set_bos_token_id(c.bos_token_id);
        response->set_max_logprobs(kMaxLogprobs);
        response->set_max_n(engine.max_n());  // --max_n, not kMaxN
        response->set_max_stop_strings(kMaxStopStrings);
        response->set_max_stop_string_bytes(kMaxStopStringBytes);
        return grpc::Status::OK;
      });
}

grpc::ServerUnaryReactor* GrpcServer::Impl::GetStats(grpc::CallbackServerContext* ctx,
                                                     const grpc::ByteBuffer* in,
                                                     grpc::ByteBuffer* out) {
  return unary<v1::GetStatsRequest, v1::GetStatsResponse>(
      ctx, in, out, [this](const v1::GetStatsRequest&, v1::GetStatsResponse* response) {
        const EngineStats st = engine.stats();
        response->set_waiting(st.waiting);
        response->set_running(st.running);
        response->set_pages_total(st.pages_total);
        response->set_pages_free(st.pages_free);
        response->set_slots_total(st.slots_total);
        response->set_slots_free(st.slots_free);
        response->set_steps(st.steps);
        response->set_prompt_tokens(st.prompt_tokens);
        response->set_generated_tokens(st.generated_tokens);
        response->set_preemptions(st.preemptions);
        response->set_prefix_hit_tokens(st.prefix_hit_tokens);
        response->set_prefix_query_tokens(st.prefix_query_tokens);
        response->set_finished_stop(st.finished_stop);
        response->set_finished_length(st.finished_length);
        response->set_finished_cancelled(st.finished_cancelled);
        response->set_finished_error(st.finished_error);
        return grpc::Status::OK;
      });
}

void GrpcServer::Impl::pump_loop() {
  std::vector<std::pair<GenerateReactor*, GenerateReactor::Action>> actions;
  while (true) {
    bell->clear();  // before the scan: an event during it rings again and we scan again
    actions.clear();
    {
      absl::MutexLock lock(&mu);
      if (stop_pump && live.empty()) return;
      for (auto it = live.begin(); it != live.end();) {
        GenerateReactor* r = *it;
        GenerateReactor::Action a = r->poll_locked();
        if (a == GenerateReactor::Action::kFinish) {
          r->report_locked();
          it = live.erase(it);  // unregistered before Finish: gRPC may delete it from then on
        } else {
          ++it;
        }
        if (a != GenerateReactor::Action::kNone) actions.emplace_back(r, a);
      }
    }
    if (actions.empty()) {
      bell->wait();
      continue;
    }
    // gRPC calls without our lock: Finish may run OnDone inline.
    for (auto& [r, a] : actions) {
      if (a == GenerateReactor::Action::kWrite)
        r->start_write();
      else
        r->finish();
    }
  }
}

GrpcServer::GrpcServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

GrpcServer::~GrpcServer() { shutdown(); }

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::start(
    Engine& engine, std::shared_ptr<const Tokenizer> tokenizer, std::string model_name,
    Metrics* metrics, const GrpcServerOptions& options) {
  auto impl =
      std::make_unique<Impl>(engine, std::move(tokenizer), std::move(model_name), metrics, options);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  const std::string host = options.host.find(':') != std::string::npos && options.host[0] != '['
                               ? absl::StrCat("[", options.host, "]")
                               : options.host;
  builder.AddListeningPort(absl::StrCat(host, ":", options.port), grpc::InsecureServerCredentials(),
                           &impl->port);
  builder.RegisterService(impl.get());
  if (!options.api_key.empty()) {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
    creators.push_back(std::make_unique<AuthInterceptorFactory>(options.api_key));
    builder.experimental().SetInterceptorCreators(std::move(creators));
  }
  impl->server = builder.BuildAndStart();
  if (!impl->server || impl->port == 0)
    return absl::UnavailableError(absl::StrCat("gRPC: cannot listen on ", host, ":", options.port));
  // Health: the server as a whole ("") and the service by name, both SERVING until shutdown().
  impl->server->GetHealthCheckService()->SetServingStatus(true);
  impl->server->GetHealthCheckService()->SetServingStatus(v1::Loom::service_full_name(), true);
  impl->pump = std::thread([p = impl.get()] { p->pump_loop(); });
  return std::unique_ptr<GrpcServer>(new GrpcServer(std::move(impl)));
}

void GrpcServer::begin_drain() {
  Impl& s = *impl_;
  s.gate->begin_drain();
  {
    absl::MutexLock lock(&s.mu);
    if (s.draining) return;
    s.draining = true;
  }
  // Every service, the server as a whole ("") included.
  s.server->GetHealthCheckService()->SetServingStatus(false);
}

int64_t GrpcServer::in_flight() const {
  absl::MutexLock lock(&impl_->mu);
  return static_cast<int64_t>(impl_->live.size());
}

void GrpcServer::shutdown() {
  Impl& s = *impl_;
  absl::MutexLock shutdown_lock(&s.shutdown_mu);
  if (s.shut_down) return;
  s.shut_down = true;
  begin_drain();
  {
    absl::MutexLock lock(&s.mu);
    for (GenerateReactor* r : s.live) r->drain_locked();
    s.stop_pump = true;
    s.wake();
  }
  // Stops listening; calls still open after the grace (a client that stopped reading) are
  // cancelled by gRPC, which reaches the pump through OnCancel / OnWriteDone(false).
  s.server->Shutdown(std::chrono::system_clock::now() + kShutdownGrace);
  s.pump.join();
  s.server->Wait();
}

int GrpcServer::port() const { return impl_->port; }

}  // namespace loom
