// The gRPC frontend on gRPC's callback API.
//
// Threads. gRPC's own callback executor runs the handlers (unary calls finish inline; Generate
// only validates, submits and hands the request's stream to the StreamPump) and the reactions
// (OnWriteDone, OnCancel, OnDone). Engine events reach a call through the StreamPump
// (server/stream_pump.h; loom-server's one pump, shared with the HTTP frontend): the call is its
// stream's sink. The sink queues the events and, when no write is in flight, starts one;
// OnWriteDone starts the next. So a call has one write in flight at most, a slow client's events
// wait in its call's queue and never hold up the pump, an idle or slow stream holds no thread, a
// token goes out as soon as it is sampled, and nothing polls.
//
// Lifetime. Each Generate or Chat call is a StreamCall, shared by gRPC (from the handler until
// OnDone), the pump (until the engine closes its stream) and `live` (until it finishes). Its
// ResponseEncoder says how events become messages (GenerateResponse, or ChatResponse through one
// ChatReplyReader per choice, server/chat_request.h). What to do next (a
// write, the Finish) is decided under the call's own lock, by whichever thread changed its state,
// and gRPC is called outside that lock: StartWrite only when no write is in flight, Finish once,
// also with no write in flight, after the call has left `live`. Once finished, a call touches
// neither gRPC nor the server: what the pump brings it later is dropped, which is why the pump
// may outlive the server. OnCancel (client cancel, deadline, lost connection) cancels the request
// in the engine at once and finishes the call as soon as no write is in flight; the request's
// pages and slot are freed at the engine's next step.
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
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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
#include "server/chat_request.h"
#include "server/chat_session.h"
#include "server/grpc_convert.h"
#include "server/metrics.h"
#include "server/readiness.h"
#include "server/response_store.h"
#include "server/stream_pump.h"

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
    case grpc::StatusCode::NOT_FOUND:
      return "404";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "429";
    case grpc::StatusCode::UNAVAILABLE:
      return "503";
    default:
      return "400";
  }
}

using RawLoomService =
    v1::Loom::WithRawCallbackMethod_Generate<v1::Loom::WithRawCallbackMethod_Chat<
        v1::Loom::WithRawCallbackMethod_DeleteSession<v1::Loom::WithRawCallbackMethod_Tokenize<
            v1::Loom::WithRawCallbackMethod_Detokenize<v1::Loom::WithRawCallbackMethod_GetModelInfo<
                v1::Loom::WithRawCallbackMethod_GetStats<v1::Loom::Service>>>>>>>;

// The engine session of gRPC session `id`: a name of its own, apart from HTTP's "responses:...".
std::string engine_session(const std::string& id) { return absl::StrCat("grpc:", id); }

// How a streaming call writes its engine events: Generate's as GenerateResponse, Chat's as
// ChatResponse. Called by one thread at a time (under the call's lock), in event order.
class ResponseEncoder {
 public:
  virtual ~ResponseEncoder() = default;
  // Serializes the message of one event into `out`.
  virtual grpc::Status encode(const RequestOutput& ev, grpc::ByteBuffer* out) = 0;
  // The metrics label of a choice that ended with `reason` (after its last event was encoded).
  virtual std::string_view finish_label(const RequestOutput& ev) const {
    return finish_reason_name(*ev.finish);
  }
};

class GenerateEncoder final : public ResponseEncoder {
 public:
  grpc::Status encode(const RequestOutput& ev, grpc::ByteBuffer* out) override {
    response_from_output(ev, &resp_);
    return serialize_response(resp_, out);
  }

 private:
  v1::GenerateResponse resp_;
};

// Each choice's reply read by its own ChatReplyReader (server/chat_request.h), as HTTP reads it.
// A session turn (one choice) also collects its reply and, when the turn completes, keeps the
// conversation (server/chat_session.h) before encoding the last message, so a client that sends
// the next turn as soon as it sees the end finds it, as over HTTP.
class ChatEncoder final : public ResponseEncoder {
 public:
  ChatEncoder(const ChatOutputOptions& output, int n, std::string session_id, ConversationTurn kept)
      : session_id_(std::move(session_id)), kept_(std::move(kept)) {
    readers_.reserve(n);
    for (int i = 0; i < n; ++i) readers_.push_back(std::make_unique<ChatReplyReader>(output));
  }
  grpc::Status encode(const RequestOutput& ev, grpc::ByteBuffer* out) override {
    if (ev.index < 0 || ev.index >= static_cast<int>(readers_.size()))
      return grpc::Status(grpc::StatusCode::INTERNAL, "the engine sent an event of no choice");
    ChatReplyReader& reader = *readers_[ev.index];
    const ChatDelta delta = reader.feed(ev);
    chat_response_from_output(ev, delta, reader.made_tool_calls(), &resp_);
    if (!session_id_.empty()) {
      resp_.set_session_id(session_id_);
      transcript_.add(delta, ev.token_ids);
      if (ev.finish) {
        resp_.mutable_usage()->set_cached_tokens(ev.cached_tokens);
        if (*ev.finish == FinishReason::kStop || *ev.finish == FinishReason::kLength)
          kept_.record(transcript_.message(), transcript_.token_ids(), "");
      }
    }
    return serialize_response(resp_, out);
  }
  std::string_view finish_label(const RequestOutput& ev) const override {
    const bool calls = ev.index >= 0 && ev.index < static_cast<int>(readers_.size()) &&
                       readers_[ev.index]->made_tool_calls();
    return chat_finish_reason(*ev.finish, calls);  // "tool_calls", as HTTP reports it
  }

 private:
  std::vector<std::unique_ptr<ChatReplyReader>> readers_;  // by choice index (not movable)
  v1::ChatResponse resp_;
  // Session turns only (n is 1).
  const std::string session_id_;  // empty: no session
  const ConversationTurn kept_;   // null store: store false
  ReplyTranscript transcript_;
};

}  // namespace

class StreamCall;

struct GrpcServer::Impl final : public RawLoomService {
  Impl(Engine& e, std::shared_ptr<const Tokenizer> tok, std::string name, Metrics* m,
       const GrpcServerOptions& options)
      : engine(e),
        tokenizer(std::move(tok)),
        model_name(std::move(name)),
        metrics(m),
        api_key(options.api_key),
        chat(options.chat),
        own_gate(options.admission
                     ? nullptr
                     : std::make_unique<AdmissionGate>(options.max_running, options.max_queue)),
        gate(options.admission ? options.admission : own_gate.get()),
        own_pump(options.pump ? nullptr : std::make_unique<StreamPump>(1)),
        pump(options.pump ? options.pump : own_pump.get()),
        sessions(options.sessions
                     ? options.sessions
                     : std::make_shared<ResponseStore>(kDefaultMaxSessionConversations,
                                                       absl::Seconds(kDefaultSessionTtlS))) {}

  // The Loom service, raw (see the top of this file).
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* ctx,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Chat(grpc::CallbackServerContext* ctx,
                                                   const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* DeleteSession(grpc::CallbackServerContext* ctx,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;
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
  // A streaming method's refusal (counted in metrics as HTTP counts the same refusal).
  grpc::ServerWriteReactor<grpc::ByteBuffer>* reject(const grpc::Status& status);
  // Generate's and Chat's common tail: takes an admission ticket, submits `r` and hands its stream
  // to the pump and a new StreamCall writing it with `encoder`.
  grpc::ServerWriteReactor<grpc::ByteBuffer>* submit(grpc::CallbackServerContext* ctx,
                                                     absl::Time received, Request r,
                                                     std::unique_ptr<ResponseEncoder> encoder);
  // A unary method: admit_call, parse the request, `handle` it (a grpc::Status), serialize.
  template <class Req, class Resp, class Handle>
  grpc::ServerUnaryReactor* unary(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                  grpc::ByteBuffer* out, Handle handle);

  // Constant after start().
  Engine& engine;
  const std::shared_ptr<const Tokenizer> tokenizer;
  const std::string model_name;
  Metrics* const metrics;
  const std::string api_key;
  const ChatSetup chat;  // how Chat renders prompts and reads replies (HTTP's)
  const std::unique_ptr<AdmissionGate> own_gate;  // when the options bring none
  AdmissionGate* const gate;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  Readiness* readiness = nullptr;  // options.readiness, until shutdown() unsubscribes
  int readiness_listener = 0;
  // After `server`: the calls its jobs hold die before gRPC does.
  const std::unique_ptr<StreamPump> own_pump;  // when the options bring none
  StreamPump* const pump;
  // Chat sessions' conversations by session id (thread-safe; shared with their ChatEncoders).
  const std::shared_ptr<ResponseStore> sessions;

  absl::Mutex mu;  // never held with a call's own lock
  // Generate and Chat calls by request id, registered until they finish.
  std::map<uint64_t, std::shared_ptr<StreamCall>> live ABSL_GUARDED_BY(mu);
  bool draining ABSL_GUARDED_BY(mu) = false;
  bool stopped ABSL_GUARDED_BY(mu) = false;  // shutdown() took its list of live calls
  absl::Mutex shutdown_mu;                   // serializes shutdown()
  bool shut_down ABSL_GUARDED_BY(shutdown_mu) = false;
};

// One Generate or Chat call: the reactor gRPC drives and the sink the pump feeds (see the top of
// this file). Thread-safe: every method may run on any thread, at the same time as the others.
class StreamCall final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  StreamCall(GrpcServer::Impl& s, uint64_t request_id, absl::Time received,
             AdmissionGate::Ticket ticket, std::unique_ptr<ResponseEncoder> encoder)
      : s_(s),
        request_id_(request_id),
        received_(received),
        encoder_(std::move(encoder)),
        ticket_(std::move(ticket)),
        last_token_(received) {}

  // Keeps the call alive for gRPC, which may call it until OnDone.
  void hold_self(std::shared_ptr<StreamCall> self) { self_ = std::move(self); }

  // The pump's sink: queues the events, then writes or finishes whatever is due.
  void on_events(std::vector<RequestOutput> events, bool closed) {
    {
      absl::MutexLock lock(&mu_);
      if (!finished_ && !cancelled_) {
        for (RequestOutput& e : events) queue_.push_back(std::move(e));
        stream_closed_ = stream_closed_ || closed;
      }
    }
    advance();
  }

  // The drain timeout passed: ends the call with UNAVAILABLE (after the write in flight, if any)
  // and cancels the request.
  void drain() {
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || cancelled_) return;
      cancel_locked();
      cancel_status_ =
          grpc::Status(grpc::StatusCode::UNAVAILABLE,
                       absl::StrCat(kShuttingDown, ": the drain timeout ended this stream after ",
                                    completion_tokens_, " tokens"));
    }
    advance();
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      write_in_flight_ = false;
      if (!ok && !cancelled_) cancel_locked();  // the client is gone
    }
    advance();
  }
  void OnCancel() override {
    {
      absl::MutexLock lock(&mu_);
      if (!cancelled_ && !finished_) cancel_locked();
    }
    advance();
  }
  void OnDone() override { self_.reset(); }  // may delete this

 private:
  enum class Step { kNone, kWrite, kFinish };

  // Makes the gRPC call that is due, if any, outside mu_: Finish may run OnDone inline.
  void advance() {
    Step step;
    {
      absl::MutexLock lock(&mu_);
      step = next_locked();
    }
    if (step == Step::kWrite) {
      StartWrite(&out_);
    } else if (step == Step::kFinish) {
      {
        absl::MutexLock lock(&s_.mu);
        s_.live.erase(request_id_);
      }
      Finish(finish_status_);  // the last thing this call does with gRPC or the server
    }
  }

  // What is due now. kWrite: out_ holds the next message and a write is in flight. kFinish:
  // finish_status_ is set and the call is finished (reported, admission given back).
  Step next_locked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || write_in_flight_) return Step::kNone;
    if (cancelled_) return finish_locked(cancel_status_);
    if (!queue_.empty()) {
      RequestOutput ev = std::move(queue_.front());
      queue_.pop_front();
      observe(ev);
      if (grpc::Status st = encoder_->encode(ev, &out_); !st.ok()) {
        cancel_locked();
        return finish_locked(st);
      }
      write_in_flight_ = true;
      return Step::kWrite;
    }
    if (!stream_closed_) return Step::kNone;
    return finish_locked(error_.empty() ? grpc::Status::OK
                                        : grpc::Status(grpc::StatusCode::INTERNAL, error_));
  }

  Step finish_locked(grpc::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    finished_ = true;
    finish_status_ = std::move(status);
    queue_.clear();
    out_.Clear();  // no write in flight: gRPC holds no pointer into it
    report_locked();
    return Step::kFinish;
  }

  void cancel_locked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    cancelled_ = true;
    s_.engine.cancel(request_id_);
    if (s_.metrics && !reported_) {
      reported_ = true;
      s_.metrics->on_request_finished("cancelled", prompt_tokens_, completion_tokens_);
      s_.metrics->observe_e2e(seconds_since(received_));
    }
  }

  // Metrics of one event, as it goes out.
  void observe(const RequestOutput& ev) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    completion_tokens_ += static_cast<int>(ev.token_ids.size());
    if (ev.finish && *ev.finish == FinishReason::kError && error_.empty())
      error_ = ev.error.empty() ? "the engine failed the request" : ev.error;
    if (ev.finish) {
      prompt_tokens_ = ev.prompt_tokens;
      last_reason_ = *ev.finish;
      last_label_ = encoder_->finish_label(ev);
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

  // Reports the request to metrics once and gives its admission back, at the end.
  void report_locked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ticket_.reset();
    if (!s_.metrics || reported_) return;
    reported_ = true;
    // Metrics counts cancellations under its own label, "cancelled" (what cancel_locked() and the
    // HTTP frontend's disconnects report), not OpenAI's "abort".
    const std::string_view reason =
        last_reason_ == FinishReason::kCancelled ? "cancelled" : last_label_;
    s_.metrics->on_request_finished(reason, prompt_tokens_, completion_tokens_);
    s_.metrics->observe_e2e(seconds_since(received_));
  }

  GrpcServer::Impl& s_;
  const uint64_t request_id_;
  const absl::Time received_;
  std::shared_ptr<StreamCall> self_;  // set by submit, reset by OnDone
  // Used under mu_ only (encode: before the write it fills; finish_label: from observe).
  const std::unique_ptr<ResponseEncoder> encoder_;

  absl::Mutex mu_;
  std::deque<RequestOutput> queue_ ABSL_GUARDED_BY(mu_);  // from the pump, not yet written
  bool stream_closed_ ABSL_GUARDED_BY(mu_) = false;       // the pump brought the last events
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // Finish is due or done: nothing more happens
  grpc::Status cancel_status_ ABSL_GUARDED_BY(mu_){grpc::StatusCode::CANCELLED, "cancelled"};
  AdmissionGate::Ticket ticket_ ABSL_GUARDED_BY(mu_);  // held until the call finishes
  bool reported_ ABSL_GUARDED_BY(mu_) = false;
  std::string error_ ABSL_GUARDED_BY(mu_);  // the first choice error
  bool first_token_seen_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_token_ ABSL_GUARDED_BY(mu_);
  int prompt_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int completion_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  FinishReason last_reason_ ABSL_GUARDED_BY(mu_) = FinishReason::kNone;
  std::string_view last_label_ ABSL_GUARDED_BY(mu_);  // its metrics label (a static string)
  // Written under mu_ when a write or the Finish is decided, read by gRPC (out_, until
  // OnWriteDone) or by the thread that calls Finish: nobody writes them meanwhile.
  grpc::ByteBuffer out_;
  grpc::Status finish_status_;
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

grpc::ServerWriteReactor<grpc::ByteBuffer>* GrpcServer::Impl::reject(const grpc::Status& status) {
  struct Rejected final : grpc::ServerWriteReactor<grpc::ByteBuffer> {
    explicit Rejected(const grpc::Status& st) { Finish(st); }
    void OnDone() override { delete this; }
  };
  if (metrics) metrics->on_request_rejected(rejection_label(status.error_code()));
  return new Rejected(status);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* GrpcServer::Impl::submit(
    grpc::CallbackServerContext* ctx, absl::Time received, Request r,
    std::unique_ptr<ResponseEncoder> encoder) {
  if (r.tag.empty()) r.tag = absl::StrCat("grpc:", ctx->peer());
  AdmissionGate::Ticket ticket;
  if (absl::Status st = gate->try_acquire(1, &ticket); !st.ok()) return reject(to_grpc_status(st));
  absl::StatusOr<std::shared_ptr<RequestStream>> stream = engine.submit(std::move(r));
  if (!stream.ok()) {
    // The engine was shut down, or the session's previous turn still runs: both worth a retry
    // (HTTP's 503), and the engine's words say which.
    if (absl::IsFailedPrecondition(stream.status()))
      return reject(
          grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string(stream.status().message())));
    return reject(to_grpc_status(stream.status()));
  }
  const uint64_t id = (*stream)->id();
  std::shared_ptr<StreamCall> call;
  {
    absl::MutexLock lock(&mu);
    if (!stopped) {
      call =
          std::make_shared<StreamCall>(*this, id, received, std::move(ticket), std::move(encoder));
      call->hold_self(call);
      live.emplace(id, call);
    }
  }
  if (!call) {
    // shutdown() got past its drain while we submitted: nobody would end this call.
    engine.cancel(id);
    return reject(grpc::Status(grpc::StatusCode::UNAVAILABLE, kShuttingDown));
  }
  pump->add(*std::move(stream), [call](std::vector<RequestOutput> events, bool closed) {
    call->on_events(std::move(events), closed);
  });
  return call.get();
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* GrpcServer::Impl::Generate(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in) {
  const absl::Time received = absl::Now();
  if (grpc::Status st = admit_call(*ctx); !st.ok()) return reject(st);
  v1::GenerateRequest request;
  if (grpc::Status st = parse_request(in, &request); !st.ok()) return reject(st);
  absl::StatusOr<Request> r = request_from_proto(
      request, tokenizer.get(), engine.config().vocab_size, engine.max_model_len());
  if (!r.ok()) return reject(to_grpc_status(r.status()));
  return submit(ctx, received, *std::move(r), std::make_unique<GenerateEncoder>());
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* GrpcServer::Impl::Chat(grpc::CallbackServerContext* ctx,
                                                                   const grpc::ByteBuffer* in) {
  const absl::Time received = absl::Now();
  if (grpc::Status st = admit_call(*ctx); !st.ok()) return reject(st);
  v1::ChatRequest request;
  if (grpc::Status st = parse_request(in, &request); !st.ok()) return reject(st);
  if (!tokenizer) {
    return reject(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                               "this model is served without a tokenizer: Chat needs one to render "
                               "messages; use Generate with token_ids"));
  }
  // A session turn continues the conversation kept under its id (server/chat_session.h). The
  // request's own checks come before the lookup, so a malformed request is never NOT_FOUND.
  if (grpc::Status st = to_grpc_status(check_no_unknown_fields(request)); !st.ok())
    return reject(st);
  if (grpc::Status st = to_grpc_status(check_chat_session_fields(request)); !st.ok())
    return reject(st);
  const std::string& id = request.session_id();
  ConversationTurn kept;
  std::shared_ptr<const ChatHistory> history;
  std::shared_ptr<const ConversationTokens> history_tokens;  // what the model saw of `history`
  if (!id.empty()) {
    kept.session = engine_session(id);
    if (std::optional<ResponseStore::Entry> entry = sessions->get(id, absl::Now())) {
      history = std::move(entry->messages);
      history_tokens = std::move(entry->tokens);
      kept.session = std::move(entry->session);
    } else if (request.session_must_exist()) {
      return reject(
          grpc::Status(grpc::StatusCode::NOT_FOUND,
                       absl::StrCat("session_id: no session '", id,
                                    "' (never created, deleted, expired or evicted); send without "
                                    "session_must_exist to start it")));
    }
    if (!request.has_store() || request.store()) {
      kept.store = sessions;
      kept.key = id;
      kept.history = history;
    }
  }
  // HTTP's parser, renderer and reader (server/chat_request.h), from the same request.
  absl::StatusOr<OpenAiRequest> parsed =
      chat_request_from_proto(request, engine.config().vocab_size, history.get());
  if (!parsed.ok()) return reject(to_grpc_status(parsed.status()));
  if (kept.store) kept.take_new_messages(*parsed, 0);
  absl::StatusOr<PreparedChat> prepared =
      prepare_chat(*parsed, *tokenizer, chat, engine.max_model_len(), history_tokens.get(),
                   /*keep_prompt=*/kept.store != nullptr);
  if (!prepared.ok()) return reject(to_grpc_status(prepared.status()));
  kept.prompt = prepared->prompt;
  kept.tokenizer = tokenizer;
  prepared->request.tag = request.request_id();
  kept.apply(&prepared->request);
  const int n = prepared->request.params.n;
  return submit(ctx, received, std::move(prepared->request),
                std::make_unique<ChatEncoder>(prepared->output, n, id, std::move(kept)));
}

grpc::ServerUnaryReactor* GrpcServer::Impl::DeleteSession(grpc::CallbackServerContext* ctx,
                                                          const grpc::ByteBuffer* in,
                                                          grpc::ByteBuffer* out) {
  return unary<v1::DeleteSessionRequest, v1::DeleteSessionResponse>(
      ctx, in, out, [this](const v1::DeleteSessionRequest& request, v1::DeleteSessionResponse*) {
        const std::string& id = request.session_id();
        if (grpc::Status st = to_grpc_status(check_session_id(id, "session_id")); !st.ok())
          return st;
        std::string session = engine_session(id);
        const bool stored = sessions->erase(id, absl::Now(), &session, nullptr);
        // The engine may still hold the session after its conversation left the store (evicted
        // past --max_stored_responses): delete what is there.
        const bool in_engine = engine.delete_session(session).ok();
        if (!stored && !in_engine) {
          return grpc::Status(grpc::StatusCode::NOT_FOUND,
                              absl::StrCat("session_id: no session '", id,
                                           "' (never created, deleted, expired or evicted)"));
        }
        return grpc::Status::OK;
      });
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
  // Health: the server as a whole ("") and the service by name, following the readiness when
  // there is one. Set under mu, as begin_drain() does, and never after it: the drain is final.
  // Watch streams hear every set, so each change is set once, for every service at once.
  impl->server->GetHealthCheckService()->SetServingStatus(v1::Loom::service_full_name(), false);
  Impl* const s = impl.get();
  auto set_serving = [s](bool serving) {
    absl::MutexLock lock(&s->mu);
    if (!s->draining) s->server->GetHealthCheckService()->SetServingStatus(serving);
  };
  if (options.readiness != nullptr) {
    impl->readiness = options.readiness;
    impl->readiness_listener = options.readiness->subscribe(set_serving);
  } else {
    set_serving(true);
  }
  return std::unique_ptr<GrpcServer>(new GrpcServer(std::move(impl)));
}

void GrpcServer::begin_drain() {
  Impl& s = *impl_;
  s.gate->begin_drain();
  {
    absl::MutexLock lock(&s.mu);
    if (s.draining) return;
    s.draining = true;
    // Every service, the server as a whole ("") included.
    s.server->GetHealthCheckService()->SetServingStatus(false);
  }
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
  if (s.readiness != nullptr) s.readiness->unsubscribe(s.readiness_listener);
  begin_drain();
  std::vector<std::shared_ptr<StreamCall>> calls;
  {
    absl::MutexLock lock(&s.mu);
    s.stopped = true;
    for (const auto& [id, call] : s.live) calls.push_back(call);
  }
  for (const auto& call : calls) call->drain();  // takes s.mu to unregister: not under it
  calls.clear();
  // Stops listening; calls still open after the grace (a write to a client that stopped reading)
  // are cancelled by gRPC, whose OnWriteDone(false) / OnCancel then finishes them.
  s.server->Shutdown(std::chrono::system_clock::now() + kShutdownGrace);
  s.server->Wait();
  if (s.own_pump) s.own_pump->stop();
}

int GrpcServer::port() const { return impl_->port; }

}  // namespace loom
