// RequestStream: the per-request channel from the engine loop (producer) to the client (consumer).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/request.h"

namespace loom {

// Thread-safe. The engine pushes events and closes the stream once every choice has finished; the
// client pops them. Destroying the client's handle does not cancel the request: call
// Engine::cancel (the frontends do when a connection closes).
class RequestStream {
 public:
  RequestStream(uint64_t id, int32_t num_choices) : id_(id), num_choices_(num_choices) {}

  uint64_t id() const { return id_; }
  int32_t num_choices() const { return num_choices_; }

  // Blocks until an event is available (returns it) or the stream is closed and drained
  // (returns nullopt). With a timeout, also returns nullopt when it expires (check closed()).
  std::optional<RequestOutput> next(absl::Duration timeout = absl::InfiniteDuration());
  bool closed() const;

  // Called after every push and after close, on the engine's thread and outside the stream's
  // lock, so a consumer watching many streams can sleep until one has news instead of polling.
  // It must be cheap and must not block; nullptr removes it, but a call already under way (copied
  // before the removal) may still run after set_on_ready returns, so whatever it captures must
  // stay valid (share it, as the server's Doorbell is shared). Events pushed before it was set are
  // not announced: a consumer drains the stream once after setting it.
  void set_on_ready(std::function<void()> on_ready);

  // Engine side.
  void push(RequestOutput out);
  void close();

 private:
  const uint64_t id_;
  const int32_t num_choices_;
  mutable absl::Mutex mu_;
  std::deque<RequestOutput> events_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> on_ready_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loom
