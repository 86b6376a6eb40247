// Metrics: the server's Prometheus counters, gauges and histograms, shared by the HTTP and gRPC
// frontends. Every method is thread-safe (one mutex; calls are a few adds). Gauges that the engine
// already tracks (queue length, running requests, page and slot usage, prefix-cache hits,
// preemptions) are read from EngineStats at render time, so they never drift from the engine.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "core/status.h"
#include "engine/engine.h"

namespace loom {

// A Prometheus histogram with fixed upper bounds (seconds).
class LatencyHistogram {
 public:
  explicit LatencyHistogram(std::vector<double> bounds);
  void observe(double seconds);
  // Appends `name_bucket{le=...}`, `name_sum` and `name_count` lines (HELP/TYPE lines excluded).
  void render(std::string_view name, std::string* out) const;

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // one per bound, plus +Inf; not cumulative
  double sum_ = 0.0;
  int64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();

  // A request finished (any frontend). `reason`: "stop", "length", "tool_calls", "cancelled" (the
  // client left), "abort" (the engine cancelled it, e.g. at the end of a drain), "error" (one count
  // per request; a request with n choices reports its last choice's reason).
  void on_request_finished(std::string_view reason, int prompt_tokens, int completion_tokens);
  // A request was rejected before reaching the engine (`status` is e.g. "400", "429", "503").
  void on_request_rejected(std::string_view status);
  // Time from receipt to the first generated token, and between later tokens of one choice.
  void observe_ttft(double seconds);
  void observe_itl(double seconds);
  // End-to-end request latency (receipt to last byte).
  void observe_e2e(double seconds);
  // Open client connections (HTTP); the gRPC frontend may ignore it.
  void add_connections(int delta);
  // A client stopped reading its reply and was disconnected (HTTP write timeout or pending-bytes
  // cap; its request is also counted as finished "cancelled").
  void on_slow_client_disconnect();

  // The Prometheus text exposition (version 0.0.4) of everything above plus `stats`.
  std::string render(const EngineStats& stats) const;
  // render(engine.stats()) and the engine's ranks (expert parallelism; one rank, rank="0",
  // without): each rank's waiting and running requests and tokens queued plus running, and the
  // experts' load balance over the ranks.
  std::string render(const Engine& engine) const;

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, int64_t, std::less<>> finished_ ABSL_GUARDED_BY(mu_);  // by reason
  std::map<std::string, int64_t, std::less<>> rejected_ ABSL_GUARDED_BY(mu_);  // by status
  int64_t prompt_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t completion_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t connections_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t slow_client_disconnects_ ABSL_GUARDED_BY(mu_) = 0;
  LatencyHistogram ttft_ ABSL_GUARDED_BY(mu_);
  LatencyHistogram itl_ ABSL_GUARDED_BY(mu_);
  LatencyHistogram e2e_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loom
