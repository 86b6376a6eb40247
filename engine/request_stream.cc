#include "engine/request_stream.h"

namespace loom {

std::optional<RequestOutput> RequestStream::next(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !events_.empty() || closed_; };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  if (events_.empty()) return std::nullopt;
  RequestOutput out = std::move(events_.front());
  events_.pop_front();
  return out;
}

bool RequestStream::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_ && events_.empty();
}

void RequestStream::set_on_ready(std::function<void()> on_ready) {
  absl::MutexLock lock(&mu_);
  on_ready_ = std::move(on_ready);
}

void RequestStream::push(RequestOutput out) {
  std::function<void()> on_ready;
  {
    absl::MutexLock lock(&mu_);
    events_.push_back(std::move(out));
    on_ready = on_ready_;
  }
  if (on_ready) on_ready();
}

void RequestStream::close() {
  std::function<void()> on_ready;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    on_ready = on_ready_;
  }
  if (on_ready) on_ready();
}

}  // namespace loom
