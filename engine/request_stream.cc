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

void RequestStream::push(RequestOutput out) {
  absl::MutexLock lock(&mu_);
  events_.push_back(std::move(out));
}

void RequestStream::close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

}  // namespace loom
