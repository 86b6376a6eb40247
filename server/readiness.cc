#include "server/readiness.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace loom {

std::string_view Readiness::name(Check check) {
  switch (check) {
    case Check::kModel:
      return "model";
    case Check::kWorkspace:
      return "workspace";
    case Check::kCudaGraphs:
      return "cuda_graphs";
    case Check::kFrontends:
      return "frontends";
  }
  return "unknown";
}

void Readiness::pass(Check check, std::string detail) {
  {
    absl::MutexLock lock(&mu_);
    CheckState& c = checks_[static_cast<int>(check)];
    c.passed = true;
    c.detail = std::move(detail);
  }
  notify();
}

void Readiness::begin_drain() {
  {
    absl::MutexLock lock(&mu_);
    draining_ = true;
  }
  notify();
}

bool Readiness::ready_locked() const {
  if (draining_) return false;
  for (const CheckState& c : checks_)
    if (!c.passed) return false;
  return true;
}

bool Readiness::ready() const {
  absl::MutexLock lock(&mu_);
  return ready_locked();
}

bool Readiness::draining() const {
  absl::MutexLock lock(&mu_);
  return draining_;
}

std::string Readiness::to_json() const {
  absl::MutexLock lock(&mu_);
  nlohmann::json checks = nlohmann::json::object();
  std::string pending;
  for (int i = 0; i < kNumChecks; ++i) {
    const std::string key(name(static_cast<Check>(i)));
    checks[key] = {{"passed", checks_[i].passed}, {"detail", checks_[i].detail}};
    if (!checks_[i].passed) absl::StrAppend(&pending, pending.empty() ? "" : ", ", key);
  }
  nlohmann::json out;
  if (draining_) {
    out["status"] = "draining";
    out["reason"] = "the server is draining (SIGTERM): it takes no new requests";
  } else if (!pending.empty()) {
    out["status"] = "starting";
    out["reason"] = absl::StrCat("start-up checks pending: ", pending);
  } else {
    out["status"] = "ready";
  }
  out["checks"] = std::move(checks);
  return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

int Readiness::subscribe(Listener listener) {
  absl::MutexLock lock(&listeners_mu_);
  // What the others last heard: a change not yet announced reaches this one with them.
  listener(announced_);
  const int id = next_id_++;
  listeners_.emplace(id, std::move(listener));
  return id;
}

void Readiness::unsubscribe(int id) {
  absl::MutexLock lock(&listeners_mu_);
  listeners_.erase(id);
}

void Readiness::notify() {
  absl::MutexLock lock(&listeners_mu_);
  const bool now = ready();
  if (now == announced_) return;
  announced_ = now;
  for (auto& [id, listener] : listeners_) listener(now);
}

}  // namespace loom
