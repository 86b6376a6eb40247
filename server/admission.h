// The rules every frontend (HTTP and gRPC) obeys, decided in one place so the two cannot drift:
// who may call (api_key_matches), how much generation work is admitted (AdmissionGate: the
// --max_queue limit), and when new work stops being admitted (AdmissionGate::begin_drain).
// main.cc owns one AdmissionGate and hands it to both frontends; docs/operations.md states the
// contract.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace loom {

// Whether `authorization` (the HTTP Authorization header, or gRPC's `authorization` metadata) is
// exactly "Bearer <api_key>". Constant time in the header's contents, so response timing does not
// reveal how much of a guess was right. An empty `api_key` means no key is required: true.
bool api_key_matches(std::string_view authorization, std::string_view api_key);

// Counts generation requests admitted and not yet finished, over every frontend. The limit is
// `max_running + max_queue`: as many requests as the engine runs at once (--max_num_seqs) plus
// --max_queue waiting behind them. try_acquire checks and counts under one lock, so simultaneous
// requests can never overshoot the limit (the old check read the engine's per-step snapshot of its
// queue, which lags behind submits). Thread-safe.
class AdmissionGate {
 public:
  AdmissionGate(int max_running, int max_queue);
  AdmissionGate(const AdmissionGate&) = delete;
  AdmissionGate& operator=(const AdmissionGate&) = delete;

  // One admission: holds `weight` units (one per engine request) until destroyed or reset().
  // Move-only; an empty Ticket holds nothing. The gate must outlive its tickets.
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& other) noexcept;
    Ticket& operator=(Ticket&& other) noexcept;
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    ~Ticket() { reset(); }
    void reset();  // releases now (idempotent)
    explicit operator bool() const { return gate_ != nullptr; }

   private:
    friend class AdmissionGate;
    Ticket(AdmissionGate* gate, int weight) : gate_(gate), weight_(weight) {}
    AdmissionGate* gate_ = nullptr;
    int weight_ = 0;
  };

  // Admits `weight` (>= 1) engine requests: OK and a holding ticket; ResourceExhausted when they
  // would exceed the limit (HTTP 429, gRPC RESOURCE_EXHAUSTED); Unavailable once draining (HTTP
  // 503, gRPC UNAVAILABLE). A refusal holds nothing.
  absl::Status try_acquire(int weight, Ticket* ticket);

  // From now on every try_acquire answers Unavailable; admitted work keeps its tickets.
  void begin_drain();
  bool draining() const;
  // Units held by live tickets (0: no admitted generation is left on any frontend).
  int64_t in_use() const;
  // Waits until in_use() is 0 or `timeout` passes; true when it reached 0.
  bool wait_idle(double timeout_s) const;
  int64_t limit() const { return limit_; }

 private:
  void release(int weight);

  const int64_t limit_;
  const int max_queue_;
  mutable absl::Mutex mu_;
  int64_t in_use_ ABSL_GUARDED_BY(mu_) = 0;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
};

// Seconds a client told "queue full" should wait before retrying (HTTP Retry-After).
inline constexpr int kRetryAfterSeconds = 1;

}  // namespace loom
