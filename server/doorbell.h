// Doorbell: what a StreamPump thread (server/stream_pump.h) sleeps on until there is something to
// do. Engine streams ring it after every event (RequestStream::set_on_ready) and the pump rings it
// itself on a new stream and on stop(). The pump clears it before a pass over its streams, so a
// ring during the pass makes the next wait() return at once: nothing is missed and nothing polls.
// Shared through a shared_ptr, so a stream that outlives its pump rings a live object.
#pragma once

#include "absl/synchronization/mutex.h"

namespace loom {

class Doorbell {
 public:
  void ring() {
    absl::MutexLock lock(&mu_);
    rung_ = true;
  }
  void clear() {
    absl::MutexLock lock(&mu_);
    rung_ = false;
  }
  // Returns once rung (at once if it was rung since the last clear()).
  void wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&rung_));
  }

 private:
  absl::Mutex mu_;
  bool rung_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace loom
