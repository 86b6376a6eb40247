// GrpcServer: the gRPC frontend of loom-server (service loom.v1.Loom, proto/loom/v1/loom.proto),
// plus the standard grpc.health.v1.Health service and server reflection. Built on gRPC's callback
// API: a streaming Generate holds no thread while it waits for tokens. See docs/grpc.md.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/engine.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/chat_setup.h"

namespace loom {

class AdmissionGate;  // server/admission.h
class Metrics;        // server/metrics.h (may be absent from the build; then pass null)
class StreamPump;     // server/stream_pump.h
class Readiness;      // server/readiness.h
class ResponseStore;  // server/response_store.h

struct GrpcServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port (read it back with port())
  // Non-empty: every method but grpc.health.v1 (the Loom service and server reflection) needs
  // metadata `authorization: Bearer <api_key>`, else UNAUTHENTICATED.
  std::string api_key;
  // The --max_queue and drain gate shared with the HTTP frontend (must outlive the server). Null:
  // the server keeps its own gate of max_running + max_queue requests.
  AdmissionGate* admission = nullptr;
  int max_running = 64;
  int max_queue = 256;
  // The pump that moves engine outputs to the Generate streams, shared with the HTTP frontend
  // (HttpServer::pump()): it must run until shutdown() returns. It may hold streams of ended calls
  // after that, until the engine closes them; it then drops them without touching the server.
  // Null: the server runs its own pump of one thread.
  StreamPump* pump = nullptr;
  // How Chat renders prompts and reads replies: loom-server passes the HTTP frontend's (one
  // load_chat_setup for both). The default is the native family's built-in template and syntax.
  ChatSetup chat;
  // Health (grpc.health.v1, the server as a whole and loom.v1.Loom) follows it: NOT_SERVING until
  // ready, SERVING while ready, NOT_SERVING from the drain on. It must outlive the server. Null:
  // SERVING from start() to the drain.
  Readiness* readiness = nullptr;
  // Chat sessions' conversations, by session id (server/chat_session.h). loom-server passes one
  // bounded as HTTP's stored responses (--max_stored_responses, --session_ttl_s). Null: the server
  // keeps its own, of kDefaultMaxSessionConversations for kDefaultSessionTtlS.
  std::shared_ptr<ResponseStore> sessions;
};

inline constexpr int64_t kDefaultMaxSessionConversations = 10000;
inline constexpr double kDefaultSessionTtlS = 3600;

class GrpcServer {
 public:
  // Binds host:port and starts serving. `engine` must outlive the server; `tokenizer` may be null
  // (then text input, Tokenize and Detokenize answer FAILED_PRECONDITION); `metrics` may be null.
  // Unavailable when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> start(
      Engine& engine, std::shared_ptr<const Tokenizer> tokenizer, std::string model_name,
      Metrics* metrics, const GrpcServerOptions& options);
  ~GrpcServer();  // shutdown()

  // The drain begins: health turns NOT_SERVING (the server as a whole and loom.v1.Loom), new calls
  // get UNAVAILABLE, and live Generate streams go on; the server keeps listening so that health
  // checks see NOT_SERVING. Idempotent; thread-safe.
  void begin_drain();
  // Generate streams not yet finished.
  int64_t in_flight() const;
  // Ends the drain: begin_drain() if not done, then every stream still live ends with UNAVAILABLE
  // (after its last delivered tokens; cancelled in the engine) and the server stops, giving
  // clients at most about half a second to take the final status. Idempotent; thread-safe.
  void shutdown();
  // The bound port.
  int port() const;

  struct Impl;

 private:
  explicit GrpcServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom
