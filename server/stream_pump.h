// StreamPump: moves engine outputs from RequestStreams to clients without blocking an I/O thread,
// for every frontend (loom-server's HTTP and gRPC frontends share one). A few pump threads (not
// one per request) each own a set of streams. Every stream tells its pump when it has news
// (RequestStream::set_on_ready, called by the engine after each push), so a pump sleeps on a
// Doorbell until then: a pass drains every stream of the pump without waiting (next(ZeroDuration))
// and hands what it found to that stream's sink. Latency cost: one wake-up; cost when nothing is
// generated: none.
//
// Sinks run on a pump thread and must not block, since every other stream of that thread waits
// for them: an HTTP session posts the events to its strand, a gRPC call queues them behind its one
// write in flight. A sink is called with closed = true exactly once, last; the stream and the sink
// are then dropped (on the pump thread). A frontend that may go away before the pump (gRPC's,
// on the HTTP frontend's pump) keeps its sinks safe to call after it is gone: they touch only
// what they own a share of, and do nothing once their request has ended.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "engine/request_stream.h"
#include "server/doorbell.h"

namespace loom {

class StreamPump {
 public:
  using Sink = std::function<void(std::vector<RequestOutput> events, bool closed)>;

  explicit StreamPump(int num_threads);
  ~StreamPump();  // stop()

  // Starts pumping `stream` into `sink`. Thread-safe. After stop(), the stream is not pumped (the
  // sink is destroyed at once, never called).
  void add(std::shared_ptr<RequestStream> stream, Sink sink);
  // Streams being pumped (added and not yet closed).
  int64_t active() const;
  // Joins the threads; streams still open are dropped, their sinks destroyed without a closing
  // call before stop() returns. Idempotent; thread-safe.
  void stop();

 private:
  struct Job {
    std::shared_ptr<RequestStream> stream;
    Sink sink;
  };
  struct Worker {
    absl::Mutex mu;
    std::vector<Job> incoming ABSL_GUARDED_BY(mu);
    bool closed ABSL_GUARDED_BY(mu) = false;  // the thread has exited: add() drops its job
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
