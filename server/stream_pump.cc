#include "server/stream_pump.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/time/time.h"

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
  stream->set_on_ready([bell = w->bell] { bell->ring(); });
  std::optional<Job> dropped;
  {
    absl::MutexLock lock(&w->mu);
    if (w->closed) {
      dropped = Job{std::move(stream), std::move(sink)};
    } else {
      w->incoming.push_back(Job{std::move(stream), std::move(sink)});
    }
  }
  if (dropped) {  // stopped: no thread would ever call the sink
    dropped->stream->set_on_ready(nullptr);
    absl::MutexLock lock(&mu_);
    --active_;
    return;  // the sink is destroyed here, outside every lock of ours
  }
  w->bell->ring();  // the first pass drains what was pushed before the callback was set
}

int64_t StreamPump::active() const {
  absl::MutexLock lock(&mu_);
  return active_;
}

void StreamPump::stop() {
  if (stopping_.exchange(true)) {
    // A concurrent stop() returns only once the threads are gone, as the first one does.
    for (auto& w : workers_) {
      absl::MutexLock lock(&w->mu);
      w->mu.Await(absl::Condition(&w->closed));
    }
    return;
  }
  for (auto& w : workers_) {
    w->bell->ring();
    if (w->thread.joinable()) w->thread.join();
  }
}

void StreamPump::run(Worker* w) {
  std::vector<Job> jobs;
  while (!stopping_.load()) {
    w->bell->clear();  // before the pass: a push during it rings again and we pass again
    {
      absl::MutexLock lock(&w->mu);
      for (Job& j : w->incoming) jobs.push_back(std::move(j));
      w->incoming.clear();
    }
    for (size_t i = 0; i < jobs.size();) {
      Job& job = jobs[i];
      std::vector<RequestOutput> events;
      while (auto e = job.stream->next(absl::ZeroDuration())) events.push_back(std::move(*e));
      bool closed = job.stream->closed();
      if (closed) {  // close() follows the last push: drain what arrived after our last look
        while (auto e = job.stream->next(absl::ZeroDuration())) events.push_back(std::move(*e));
      }
      if (!events.empty() || closed) job.sink(std::move(events), closed);
      if (closed) {
        job.stream->set_on_ready(nullptr);
        jobs[i] = std::move(jobs.back());
        jobs.pop_back();
        absl::MutexLock lock(&mu_);
        --active_;
      } else {
        ++i;
      }
    }
    if (!stopping_.load()) w->bell->wait();  // stop() rings after setting stopping_
  }
  {
    absl::MutexLock lock(&w->mu);
    for (Job& j : w->incoming) jobs.push_back(std::move(j));
    w->incoming.clear();
    w->closed = true;
  }
  for (Job& j : jobs) j.stream->set_on_ready(nullptr);
  {
    absl::MutexLock lock(&mu_);
    active_ -= static_cast<int64_t>(jobs.size());
  }
  // The sinks die here, while whatever their frontend tears down after stop() is still alive
  // (an HTTP session's socket needs its io_context).
  jobs.clear();
}

}  // namespace loom
