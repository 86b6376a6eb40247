// Readiness: whether loom-server should be sent traffic, apart from whether it is alive (/health).
// main.cc passes each start-up check as it completes (model loaded, workspace sized, CUDA graphs
// captured or not wanted, every frontend listening) and begins the drain on SIGTERM; HTTP's
// GET /ready and the gRPC health service (grpc.health.v1) read it. Ready = every check passed and
// no drain begun; the drain is final. Probes and their Kubernetes settings: docs/deploy.md.
#pragma once

#include <array>
#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "absl/synchronization/mutex.h"

namespace loom {

class Readiness {
 public:
  // In the order loom-server passes them. An expert-parallel group will add "every rank joined"
  // when expert parallelism over NCCL exists (issue 16); until then one process is the server.
  enum class Check { kModel, kWorkspace, kCudaGraphs, kFrontends };
  static constexpr int kNumChecks = 4;
  // The check's key in /ready's JSON: "model", "workspace", "cuda_graphs", "frontends".
  static std::string_view name(Check check);

  Readiness() = default;
  Readiness(const Readiness&) = delete;
  Readiness& operator=(const Readiness&) = delete;

  // Marks `check` passed; `detail` says how (shown by /ready). Passing it again replaces the
  // detail. Thread-safe.
  void pass(Check check, std::string detail);
  // From now on not ready, for good. Idempotent; thread-safe.
  void begin_drain();

  bool ready() const;
  bool draining() const;
  // /ready's body: {"status": "ready" | "starting" | "draining", "reason": why not ready (absent
  // when ready), "checks": {name: {"passed": bool, "detail": string}}}.
  std::string to_json() const;

  // `listener(ready)` runs now with the current state and then on every change of ready(), in
  // order, on the thread that made the change (under a lock: it must not call back into this
  // object). Returns an id for unsubscribe(). Thread-safe.
  using Listener = std::function<void(bool ready)>;
  int subscribe(Listener listener);
  // After it returns the listener runs no more. Thread-safe.
  void unsubscribe(int id);

 private:
  struct CheckState {
    bool passed = false;
    std::string detail;
  };
  bool ready_locked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Calls the listeners if ready() changed since they last heard.
  void notify();

  mutable absl::Mutex mu_;
  std::array<CheckState, kNumChecks> checks_ ABSL_GUARDED_BY(mu_);
  bool draining_ ABSL_GUARDED_BY(mu_) = false;

  // Taken before mu_, never inside it: listeners hear every change in order.
  absl::Mutex listeners_mu_;
  std::map<int, Listener> listeners_ ABSL_GUARDED_BY(listeners_mu_);
  int next_id_ ABSL_GUARDED_BY(listeners_mu_) = 1;
  bool announced_ ABSL_GUARDED_BY(listeners_mu_) = false;  // the state listeners last heard
};

}  // namespace loom
