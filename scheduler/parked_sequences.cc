#include "scheduler/parked_sequences.h"

#include <utility>

namespace loom {

int64_t ParkedSequences::bytes_of(const ParkedSequence& s) const {
  return static_cast<int64_t>(s.pages.size()) * budget_.page_bytes +
         (s.slot.valid() ? budget_.slot_bytes : 0);
}

bool ParkedSequences::park(uint64_t key, ParkedSequence seq) {
  drop(key);
  const int64_t b = bytes_of(seq);
  if (budget_.max_bytes_per_sequence > 0 && b > budget_.max_bytes_per_sequence) return false;
  if (budget_.max_bytes > 0) {
    if (b > budget_.max_bytes) return offload(key, seq);
    while (bytes_ + b > budget_.max_bytes && evict_lru()) {
    }
  }
  seq.tick = ++clock_;
  insert(key, std::move(seq));
  return true;
}

std::optional<ParkedSequence> ParkedSequences::take(uint64_t key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  ParkedSequence seq;
  std::swap(seq, it->second);  // remove() below counts what `seq` holds now
  pages_ -= static_cast<int32_t>(seq.pages.size());
  slots_ -= seq.slot.valid() ? 1 : 0;
  bytes_ -= bytes_of(seq);
  lru_.erase(seq.tick);
  entries_.erase(it);
  return seq;
}

void ParkedSequences::put_back(uint64_t key, ParkedSequence seq) {
  drop(key);
  insert(key, std::move(seq));
}

void ParkedSequences::drop(uint64_t key) {
  auto it = entries_.find(key);
  if (it != entries_.end()) remove(it);
}

bool ParkedSequences::offload(uint64_t key, const ParkedSequence& s) {
  if (offload_ == nullptr) return false;
  std::vector<int32_t> ids;
  ids.reserve(s.pages.size());
  for (const IdPool::Handle& h : s.pages) ids.push_back(h.id());
  if (!offload_->offload(key, ids, s.slot.valid() ? s.slot.id() : -1, s.num_computed)) return false;
  ++offloads_;
  return true;
}

bool ParkedSequences::evict_lru() {
  if (lru_.empty()) return false;
  auto it = entries_.find(lru_.begin()->second);
  if (!offload(it->first, it->second)) ++evictions_;
  remove(it);
  return true;
}

void ParkedSequences::clear() {
  while (!lru_.empty()) {
    remove(entries_.find(lru_.begin()->second));
    ++evictions_;
  }
}

void ParkedSequences::insert(uint64_t key, ParkedSequence seq) {
  pages_ += static_cast<int32_t>(seq.pages.size());
  slots_ += seq.slot.valid() ? 1 : 0;
  bytes_ += bytes_of(seq);
  lru_.emplace(seq.tick, key);
  entries_.emplace(key, std::move(seq));
}

void ParkedSequences::remove(absl::flat_hash_map<uint64_t, ParkedSequence>::iterator it) {
  const ParkedSequence& s = it->second;
  pages_ -= static_cast<int32_t>(s.pages.size());
  slots_ -= s.slot.valid() ? 1 : 0;
  bytes_ -= bytes_of(s);
  lru_.erase(s.tick);
  entries_.erase(it);
}

}  // namespace loom
