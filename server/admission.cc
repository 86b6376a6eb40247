#include "server/admission.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace loom {

bool api_key_matches(std::string_view authorization, std::string_view api_key) {
  if (api_key.empty()) return true;
  constexpr std::string_view kScheme = "Bearer ";
  // The length is not secret (it is the configured key's); the bytes are compared without an
  // early exit, so the time taken does not depend on where the first difference is.
  if (authorization.size() != kScheme.size() + api_key.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < kScheme.size(); ++i)
    diff |= static_cast<unsigned char>(authorization[i] ^ kScheme[i]);
  for (size_t i = 0; i < api_key.size(); ++i)
    diff |= static_cast<unsigned char>(authorization[kScheme.size() + i] ^ api_key[i]);
  return diff == 0;
}

AdmissionGate::Ticket::Ticket(Ticket&& other) noexcept
    : gate_(std::exchange(other.gate_, nullptr)), weight_(std::exchange(other.weight_, 0)) {}

AdmissionGate::Ticket& AdmissionGate::Ticket::operator=(Ticket&& other) noexcept {
  if (this != &other) {
    reset();
    gate_ = std::exchange(other.gate_, nullptr);
    weight_ = std::exchange(other.weight_, 0);
  }
  return *this;
}

void AdmissionGate::Ticket::reset() {
  if (gate_ == nullptr) return;
  gate_->release(weight_);
  gate_ = nullptr;
  weight_ = 0;
}

AdmissionGate::AdmissionGate(int max_running, int max_queue)
    : limit_(int64_t{max_running} + max_queue), max_queue_(max_queue) {}

absl::Status AdmissionGate::try_acquire(int weight, Ticket* ticket) {
  absl::MutexLock lock(&mu_);
  if (draining_) return absl::UnavailableError("the server is shutting down");
  if (in_use_ + weight > limit_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the server's queue is full (", in_use_, " requests in flight, at most ",
        limit_ - max_queue_, " running and ", max_queue_, " waiting: --max_queue); retry later"));
  }
  in_use_ += weight;
  *ticket = Ticket(this, weight);
  return absl::OkStatus();
}

void AdmissionGate::release(int weight) {
  absl::MutexLock lock(&mu_);
  in_use_ -= weight;
}

void AdmissionGate::begin_drain() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
}

bool AdmissionGate::draining() const {
  absl::MutexLock lock(&mu_);
  return draining_;
}

int64_t AdmissionGate::in_use() const {
  absl::MutexLock lock(&mu_);
  return in_use_;
}

bool AdmissionGate::wait_idle(double timeout_s) const {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return in_use_ == 0; };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), absl::Seconds(timeout_s));
}

}  // namespace loom
