#include "engine/engine_inbox.h"

#include <utility>

namespace loom {

absl::StatusOr<std::shared_ptr<RequestStream>> EngineInbox::push(Request request, uint64_t session,
                                                                 int64_t continued) {
  absl::MutexLock lock(&mu_);
  if (!failed_.ok()) return failed_;
  if (stopping_) return absl::FailedPreconditionError("the engine is shutting down");
  const uint64_t id = next_id_;
  next_id_ += id_stride_;
  add_load(static_cast<int64_t>(request.prompt.size()) * request.params.n);
  auto stream = std::make_shared<RequestStream>(id, request.params.n);
  inbox_.push_back({id, std::move(request), stream, session, continued});
  ++live_;
  return stream;
}

void EngineInbox::cancel(uint64_t request_id) {
  absl::MutexLock lock(&mu_);
  cancels_.push_back(request_id);
}

void EngineInbox::drop_session(uint64_t key) {
  absl::MutexLock lock(&mu_);
  dropped_sessions_.push_back(key);
}

void EngineInbox::push_weight_update(WeightUpdate* update) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      weight_updates_.push_back(update);
      return;
    }
  }
  update->result = absl::FailedPreconditionError("the engine is shutting down");
  update->done.Notify();
}

void EngineInbox::stop() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
}

void EngineInbox::fail(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  if (failed_.ok()) failed_ = why;
  stopping_ = true;
}

void EngineInbox::wake() {
  absl::MutexLock lock(&mu_);
  woken_ = true;
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

EngineInbox::Intake EngineInbox::take(bool busy, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  // `busy` comes in as a value: absl evaluates the condition on whichever thread releases the
  // mutex, and the scheduler may only be read on the loop thread.
  auto has_work = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return busy || !inbox_.empty() || !cancels_.empty() || !dropped_sessions_.empty() ||
           !weight_updates_.empty() || stopping_ || woken_;
  };
  mu_.AwaitWithDeadline(absl::Condition(&has_work), deadline);
  Intake in;
  in.arrivals.swap(inbox_);
  in.cancels.swap(cancels_);
  in.dropped_sessions.swap(dropped_sessions_);
  in.weight_updates.swap(weight_updates_);
  in.stopping = stopping_;
  woken_ = false;
  return in;
}

void EngineInbox::publish(const EngineStats& stats, int64_t closed) {
  absl::MutexLock lock(&mu_);
  stats_ = stats;
  live_ -= closed;
}

}  // namespace loom
