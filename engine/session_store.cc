#include "engine/session_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace loom {

absl::StatusOr<SessionStore::Turn> SessionStore::begin_turn(const std::string& name,
                                                            std::span<const int32_t> new_tokens,
                                                            absl::Time now, bool whole) {
  absl::MutexLock lock(&mu_);
  uint64_t key;
  uint64_t dropped = 0;
  auto it = by_name_.find(name);
  // A session past its ttl that the loop has not expired yet is gone all the same.
  if (it != by_name_.end() && !sessions_.at(it->second).busy &&
      now - sessions_.at(it->second).last_used >= ttl_) {
    remove(it->second);
    ++expired_;
    it = by_name_.end();
  }
  if (whole && it != by_name_.end() && !sessions_.at(it->second).busy) {
    const std::vector<int32_t>& h = sessions_.at(it->second).history;
    const bool continues =
        h.size() < new_tokens.size() && std::equal(h.begin(), h.end(), new_tokens.begin());
    if (!continues) {
      dropped = it->second;
      remove(it->second);
      it = by_name_.end();
    }
  }
  if (it == by_name_.end()) {
    if (static_cast<int32_t>(sessions_.size()) >= max_sessions_)
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot start session '", name, "': this server keeps at most ",
                       max_sessions_, " sessions; delete one or wait for idle ones to expire"));
    key = next_key_++;
    by_name_.emplace(name, key);
    sessions_.emplace(key, Session{.name = name, .created_by_turn = true});
  } else {
    key = it->second;
    if (sessions_.at(key).busy)
      return absl::FailedPreconditionError(absl::StrCat(
          "session '", name, "' has a turn in progress; send the next turn once it has finished"));
    sessions_.at(key).created_by_turn = false;
  }
  Session& s = sessions_.at(key);
  s.busy = true;
  s.last_used = now;
  Turn turn;
  turn.key = key;
  turn.dropped = dropped;
  turn.continued = static_cast<int64_t>(s.history.size());
  if (whole) {
    turn.prompt.assign(new_tokens.begin(), new_tokens.end());
    return turn;
  }
  turn.prompt.reserve(s.history.size() + new_tokens.size());
  turn.prompt = s.history;
  turn.prompt.insert(turn.prompt.end(), new_tokens.begin(), new_tokens.end());
  return turn;
}

void SessionStore::abort_turn(uint64_t key) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(key);
  if (it == sessions_.end()) return;
  if (it->second.created_by_turn) {
    remove(key);
  } else {
    it->second.busy = false;
  }
}

bool SessionStore::end_turn(uint64_t key, std::optional<std::vector<int32_t>> history,
                            absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(key);
  if (it == sessions_.end()) return false;
  Session& s = it->second;
  s.busy = false;
  s.created_by_turn = false;
  s.last_used = now;
  if (history) {
    history_tokens_ +=
        static_cast<int64_t>(history->size()) - static_cast<int64_t>(s.history.size());
    s.history = *std::move(history);
  }
  return true;
}

absl::StatusOr<uint64_t> SessionStore::erase(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = by_name_.find(name);
  if (it == by_name_.end())
    return absl::NotFoundError(absl::StrCat("there is no session '", name, "'"));
  const uint64_t key = it->second;
  remove(key);
  return key;
}

bool SessionStore::contains(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  return by_name_.contains(name);
}

std::vector<uint64_t> SessionStore::expire(absl::Time now) {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> gone;
  for (const auto& [key, s] : sessions_)
    if (!s.busy && now - s.last_used >= ttl_) gone.push_back(key);
  for (uint64_t key : gone) remove(key);
  expired_ += static_cast<int64_t>(gone.size());
  return gone;
}

absl::Time SessionStore::next_expiry() const {
  absl::MutexLock lock(&mu_);
  absl::Time t = absl::InfiniteFuture();
  for (const auto& [key, s] : sessions_)
    if (!s.busy) t = std::min(t, s.last_used + ttl_);
  return t;
}

SessionStore::Stats SessionStore::stats() const {
  absl::MutexLock lock(&mu_);
  return {.sessions = static_cast<int32_t>(sessions_.size()),
          .history_tokens = history_tokens_,
          .expired = expired_};
}

void SessionStore::remove(uint64_t key) {
  auto it = sessions_.find(key);
  history_tokens_ -= static_cast<int64_t>(it->second.history.size());
  by_name_.erase(it->second.name);
  sessions_.erase(it);
}

}  // namespace loom
