#include "engine/engine_inbox.h"

#include <utility>

namespace loom {

absl::StatusOr<std::shared_ptr<RequestStream>> EngineInbox::push(Request request) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::FailedPreconditionError("the engine is shutting down");
  const uint64_t id = next_id_++;
  auto stream = std::make_shared<RequestStream>(id, request.params.n);
  inbox_.push_back({id, std::move(request), stream});
  ++live_;
  return stream;
}

void EngineInbox::cancel(uint64_t request_id) {
  absl::MutexLock lock(&mu_);
  cancels_.push_back(request_id);
}

void EngineInbox::stop() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
}

void EngineInbox::wait_idle() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int64_t* live) { return *live == 0; }, &live_));
}

EngineStats EngineInbox::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

EngineInbox::Intake EngineInbox::take(bool busy) {
  absl::MutexLock lock(&mu_);
  // `busy` comes in as a value: absl evaluates the condition on whichever thread releases the
  // mutex, and the scheduler may only be read on the loop thread.
  auto has_work = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return busy || !inbox_.empty() || !cancels_.empty() || stopping_;
  };
  mu_.Await(absl::Condition(&has_work));
  Intake in;
  in.arrivals.swap(inbox_);
  in.cancels.swap(cancels_);
  in.stopping = stopping_;
  return in;
}

void EngineInbox::publish(const EngineStats& stats, int64_t closed) {
  absl::MutexLock lock(&mu_);
  stats_ = stats;
  live_ -= closed;
}

}  // namespace loom
