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
  stream->set_on_ready([bell = w->bell] { bell->ring(); });
  {
    absl::MutexLock lock(&w->mu);
    w->incoming.push_back({std::move(stream), std::move(sink)});
  }
  w->bell->ring();  // the first pass drains what was pushed before the callback was set
}

int64_t StreamPump::active() const {
  absl::MutexLock lock(&mu_);
  return active_;
}

void StreamPump::stop() {
  if (stopping_.exchange(true)) return;
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
  for (Job& j : jobs) j.stream->set_on_ready(nullptr);
  absl::MutexLock lock(&w->mu);
  for (Job& j : w->incoming) j.stream->set_on_ready(nullptr);
}

}  // namespace loom
