// StreamPump: moves engine outputs from RequestStreams to connections without blocking an I/O
// thread. A few pump threads (not one per request) each own a set of streams. Every stream tells
// its pump when it has news (RequestStream::set_on_ready, called by the engine after each push),
// so a pump sleeps until then: a pass drains every stream of the pump without waiting
// (next(ZeroDuration)) and hands what it found to that stream's sink. Latency cost: one wake-up;
// cost when nothing is generated: none.
//
// Sinks run on a pump thread and must not block: the HTTP sessions post the events to their
// strand. A sink is called with closed = true exactly once, last; the stream is then dropped.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/request_stream.h"
#include "server/doorbell.h"

namespace loom {

class StreamPump {
 public:
  using Sink = std::function<void(std::vector<RequestOutput> events, bool closed)>;

  explicit StreamPump(int num_threads);
  ~StreamPump();  // stop()

  // Starts pumping `stream` into `sink`. Thread-safe.
  void add(std::shared_ptr<RequestStream> stream, Sink sink);
  // Streams being pumped (added and not yet closed).
  int64_t active() const;
  // Joins the threads; streams still open are dropped without a closing call. Idempotent.
  void stop();

 private:
  struct Job {
    std::shared_ptr<RequestStream> stream;
    Sink sink;
  };
  struct Worker {
    absl::Mutex mu;
    std::vector<Job> incoming ABSL_GUARDED_BY(mu);
    std::shared_ptr<Doorbell> bell = std::make_shared<Doorbell>();
    std::thread thread;
  };
  void run(Worker* w);

  std::vector<std::unique_ptr<Worker>> workers_;  // constant after construction
  std::atomic<bool> stopping_{false};
  mutable absl::Mutex mu_;
  size_t next_worker_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t active_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace loom
