// HttpServer: the OpenAI-compatible HTTP frontend (Boost.Beast). Threading: `io_threads` threads
// run one io_context; every connection is a session on its own strand, so thousands of idle or
// streaming connections cost a socket and a few buffers each, not a thread. Engine outputs reach
// sessions through the server's StreamPump (stream_pump.h): `pump_threads` threads drain the
// request streams the engine rang and post events to the sessions' strands; loom-server's gRPC
// frontend shares that pump (pump()). No server code runs on the engine's loop thread. Routes and
// formats: docs/api.md; flags and drain: docs/operations.md.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/engine.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/admission.h"
#include "server/chat_setup.h"
#include "server/metrics.h"
#include "server/server_options.h"
#include "server/stream_pump.h"

namespace loom {

class HttpServer {
 public:
  // Binds options.host:options.port (0: any free port) and starts serving. `engine`, `metrics`
  // and `admission` (the --max_queue and drain gate shared with the gRPC frontend) must outlive
  // the server. `chat` says how chat prompts are rendered and replies read (chat_setup.h).
  // Unavailable when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> start(
      Engine& engine, std::shared_ptr<const Tokenizer> tokenizer, ChatSetup chat, Metrics* metrics,
      const HttpOptions& options, AdmissionGate& admission);
  ~HttpServer();  // stop()

  int port() const;
  // From now on /health and every new request get 503 (new connections are still accepted, so
  // probes see the 503 rather than a refused connection); generations in flight go on. Stop
  // admitting work through the AdmissionGate as well. Thread-safe.
  void begin_drain();
  // Generations submitted and not yet fully written (or abandoned by their client).
  int64_t in_flight() const;
  // The pump this server's sessions use, lent to the other frontends so that one set of pump
  // threads serves them all: it runs until stop(), so a borrower must be done with it by then.
  StreamPump& pump();
  // Stops listening, the pump and the I/O threads, and closes every connection. Idempotent.
  void stop();

 private:
  struct Impl;
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom
