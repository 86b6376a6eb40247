#include "server/http_stream_pump.h"

#include <utility>

namespace loom {

StreamPump::StreamPump(int num_threads) {
  for (int i = 0; i < std::max(1, num_threads); ++i) workers_.push_back(std::make_unique<Worker>());
  for (auto& w : workers_) w->thread = std::thread([this, p = w.get()] { run(p); });
}

StreamPump::~StreamPump() { stop(); }

void StreamPump::add(std::shared_ptr<RequestStream> stream, Sink sink) {
  Worker* w;
  {
    absl::MutexLock lock(&mu_);
    w = workers_[next_worker_++ % workers_.size()].get();
    ++active_;
  }
  absl::MutexLock lock(&w->mu);
  w->incoming.push_back({std::move(stream), std::move(sink)});
}

int64_t StreamPump::active() const {
  absl::MutexLock lock(&mu_);
  return active_;
}

void StreamPump::stop() {
  if (stopping_.exchange(true)) return;
  for (auto& w : workers_) {
    { absl::MutexLock lock(&w->mu); }  // wake (Await re-evaluates on unlock)
    if (w->thread.joinable()) w->thread.join();
  }
}

void StreamPump::run(Worker* w) {
  std::vector<Job> jobs;
  while (!stopping_.load()) {
    bool progress = false;
    for (size_t i = 0; i < jobs.size();) {
      Job& job = jobs[i];
      std::vector<RequestOutput> events;
      while (auto e = job.stream->next(absl::ZeroDuration())) events.push_back(std::move(*e));
      bool closed = job.stream->closed();
      if (closed) {  // close() follows the last push: drain what arrived after our last look
        while (auto e = job.stream->next(absl::ZeroDuration())) events.push_back(std::move(*e));
      }
      if (!events.empty() || closed) {
        progress = true;
        job.sink(std::move(events), closed);
      }
      if (closed) {
        jobs[i] = std::move(jobs.back());
        jobs.pop_back();
        absl::MutexLock lock(&mu_);
        --active_;
      } else {
        ++i;
      }
    }
    // Take new jobs; sleep when this pass found nothing (indefinitely when there is no job).
    absl::MutexLock lock(&w->mu);
    auto has_new = [w, this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu) {
      return !w->incoming.empty() || stopping_.load();
    };
    if (!progress) {
      if (jobs.empty()) {
        // Wake periodically too so stop() is seen even without a new job.
        w->mu.AwaitWithTimeout(absl::Condition(&has_new), absl::Milliseconds(50));
      } else {
        w->mu.AwaitWithTimeout(absl::Condition(&has_new), kPollInterval);
      }
    }
    for (Job& j : w->incoming) jobs.push_back(std::move(j));
    w->incoming.clear();
  }
}

}  // namespace loom
