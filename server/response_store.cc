#include "server/response_store.h"

#include <utility>

namespace loom {

void ResponseStore::expire(absl::Time now) {
  // order_ holds ids in creation order; entries replaced or erased leave stale pairs behind,
  // recognised by their serial.
  while (!order_.empty()) {
    const auto& [id, serial] = order_.front();
    auto it = entries_.find(id);
    const bool live = it != entries_.end() && it->second.serial == serial;
    if (live && static_cast<int64_t>(entries_.size()) <= max_entries_ &&
        now - it->second.created < ttl_) {
      break;
    }
    if (live) {
      auto latest = latest_.find(it->second.entry.session);
      if (latest != latest_.end() && latest->second == serial) latest_.erase(latest);
      entries_.erase(it);
    }
    order_.pop_front();
  }
}

void ResponseStore::put(const std::string& id, Entry entry, absl::Time now) {
  absl::MutexLock lock(&mu_);
  const uint64_t serial = next_serial_++;
  latest_[entry.session] = serial;
  entries_[id] = Stored{std::move(entry), now, serial};
  order_.emplace_back(id, serial);
  expire(now);
}

std::optional<ResponseStore::Entry> ResponseStore::get(const std::string& id, absl::Time now) {
  absl::MutexLock lock(&mu_);
  expire(now);
  auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  return it->second.entry;
}

bool ResponseStore::erase(const std::string& id, absl::Time now, std::string* session,
                          bool* session_latest) {
  absl::MutexLock lock(&mu_);
  expire(now);
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  auto latest = latest_.find(it->second.entry.session);
  const bool is_latest = latest != latest_.end() && latest->second == it->second.serial;
  if (session) *session = it->second.entry.session;
  if (session_latest) *session_latest = is_latest;
  if (is_latest) latest_.erase(latest);
  entries_.erase(it);
  return true;
}

int64_t ResponseStore::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(entries_.size());
}

}  // namespace loom
