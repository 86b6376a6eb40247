// GrpcServer: the gRPC frontend of loom-server (service loom.v1.Loom, proto/loom/v1/loom.proto),
// plus the standard grpc.health.v1.Health service and server reflection. Built on gRPC's callback
// API: a streaming Generate holds no thread while it waits for tokens. See docs/grpc.md.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/engine.h"
#include "engine/tokenizer/tokenizer.h"

namespace loom {

struct GrpcServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port (read it back with port())
};

class Metrics;  // server/metrics.h (may be absent from the build; then pass null)

class GrpcServer {
 public:
  // Binds host:port and starts serving. `engine` must outlive the server; `tokenizer` may be null
  // (then text input, Tokenize and Detokenize answer FAILED_PRECONDITION); `metrics` may be null.
  // Unavailable when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> start(
      Engine& engine, std::shared_ptr<const Tokenizer> tokenizer, std::string model_name,
      Metrics* metrics, const GrpcServerOptions& options);
  ~GrpcServer();  // shutdown()

  // Drains: health turns NOT_SERVING, new calls get UNAVAILABLE, live Generate streams are
  // cancelled in the engine, then the server stops. Idempotent; thread-safe.
  void shutdown();
  // The bound port.
  int port() const;

  struct Impl;

 private:
  explicit GrpcServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom
