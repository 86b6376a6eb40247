// ServerOptions: everything loom-server's flags configure, read once at startup (main.cc calls
// server_options_from_flags() after absl::ParseCommandLine). The flags themselves are defined in
// server_options.cc; nothing else reads them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/engine.h"
#include "engine/expert_parallel_ranks.h"

namespace loom {

class Readiness;  // server/readiness.h

// How the HTTP frontend listens and what it accepts.
struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                      // 0: pick a free port (printed at startup)
  int io_threads = 2;                   // Asio threads running every connection
  int pump_threads = 1;                 // StreamPump threads, HTTP and gRPC (stream_pump.h)
  std::string api_key;                  // non-empty: Bearer token required but on /health, /metrics
  int64_t max_body_bytes = 4 << 20;     // 413 beyond
  int64_t max_header_bytes = 16 << 10;  // 431 beyond
  int max_queue = 256;                  // admitted beyond max_num_seqs (AdmissionGate), then 429
  double header_timeout_s = 30;         // a request's headers+body must arrive within this
  double idle_timeout_s = 300;          // keep-alive connections idle longer are closed
  // A client that stops reading its reply: a write stuck this long, or more than this many bytes
  // queued behind the kernel's send buffer, counts as the client gone (request cancelled,
  // connection closed), so a stalled reader cannot hold a KV slot or grow memory for long.
  double write_timeout_s = 60;
  int64_t max_pending_write_bytes = 16 << 20;
  std::string served_model_name;  // the `model` field clients send and see
  bool untrained = false;         // the model dir has an UNTRAINED marker
  // Host header names accepted besides loopback ones ("*": any); see host_allowed().
  std::vector<std::string> allowed_hosts;
  // What GET /ready reports (set by main.cc, not a flag; must outlive the server). Null: ready
  // from the start (the engine exists) until the drain.
  const Readiness* readiness = nullptr;
  // POST /v1/responses with store: how many responses are kept (oldest dropped first) and for
  // how long (the engine's session ttl: a continuation never outlives its session by design).
  int64_t max_stored_responses = 10000;
  double stored_response_ttl_s = 3600;
};

// --reasoning_parser: whether chat replies have their reasoning block split off.
enum class ReasoningParser {
  kAuto,  // when the checkpoint's chat template writes </think> (docs/chat.md)
  kNone,  // never: <think>...</think> stays in content
};

struct ServerOptions {
  std::string model_dir;  // the checkpoint; with random_weights, where the tokenizer etc. come from
  // --random_weights SEED: the model's weights are random (engine/model/random_weights.h), for
  // the config.json --model names (model_path: the file, or a directory holding it).
  std::optional<uint64_t> random_weights;
  std::string model_path;
  ReasoningParser reasoning_parser = ReasoningParser::kAuto;
  EngineOptions engine;                   // per rank
  ExpertParallelOptions expert_parallel;  // --expert_parallel N and the load balancer's flags
  HttpOptions http;
  int grpc_port = -1;           // < 0: no gRPC service
  double drain_timeout_s = 30;  // SIGTERM: how long in-flight requests (both frontends) may take
};

// Reads the flags. InvalidArgument naming the flag when a value is out of range. The limits whose
// default depends on the device (--max_num_batched_tokens, --max_model_len, --checkpoint_interval)
// stay kByDevice until apply_device_defaults runs with the parsed --device.
absl::StatusOr<ServerOptions> server_options_from_flags();

// The value of a limit left to the device.
inline constexpr int kByDevice = -1;
// Resolves the kByDevice limits: the CPU's bound one request's prefill, whose cost grows faster
// than linearly with the prompt (max_num_batched_tokens 2048, max_model_len 8192); a GPU's take
// prefill chunks of 8192 tokens (tensor-core rates for the GEMMs and MLA's expanded form) and the
// model's own context (max_model_len 0). The prefix cache's linear-state checkpoint interval,
// which ends a prefill chunk at each checkpoint: 8 blocks (512 tokens) on the CPU, a whole step's
// tokens on a GPU (512-token chunks made a prefix-cached prefill on an H200 ~3x slower than one
// without the cache). Limits set explicitly are left as they are.
void apply_device_defaults(Device device, EngineOptions& engine);

}  // namespace loom
