// ParkedSequences: the cache of sequences that ended a turn of a session (Request::session) and
// wait, idle, for the session's next turn. A parked sequence keeps its KV pages and the state slot
// holding the linear-attention state at exactly `num_computed` (not a block-aligned checkpoint), so
// that the next turn continues from there without recomputing anything.
//
// Budgets: a sequence whose pages and slot cost more than `max_bytes_per_sequence` is not parked;
// parking past `max_bytes` evicts the least recently parked sequences first. The scheduler also
// evicts (least recently parked first) when running requests need pages or slots, after unused
// prefix-cache entries and before preempting anyone. An evicted session only loses speed: its next
// turn is recomputed from the token history its owner keeps. With an offload tier
// (sequence_offload.h), the least recently parked sequence moves there instead, and is evicted
// only when the tier cannot hold it.
//
// Thread-safety: none; owned by the scheduler on the engine loop thread.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "scheduler/id_pool.h"
#include "scheduler/sequence_offload.h"

namespace loom {

struct ParkingBudget {
  int64_t page_bytes = 1;              // what one KV page costs (over every attention layer)
  int64_t slot_bytes = 1;              // what one state slot costs (over every linear layer)
  int64_t max_bytes_per_sequence = 0;  // 0: no limit but the cache
  int64_t max_bytes = 0;               // all parked sequences together; 0: no limit but the cache
};

struct ParkedSequence {
  std::vector<IdPool::Handle> pages;  // cover positions [0, num_computed) (and maybe one more page)
  IdPool::Handle slot;                // linear state at num_computed; empty without linear layers
  int32_t num_computed = 0;           // positions whose KV and state the sequence holds
  uint64_t tick = 0;                  // its place in the eviction order (ParkedSequences sets it)
};

class ParkedSequences {
 public:
  // `offload` (may be null: evictions only) must outlive this.
  explicit ParkedSequences(const ParkingBudget& budget, SequenceOffload* offload = nullptr)
      : budget_(budget), offload_(offload) {}

  int64_t bytes_of(const ParkedSequence& s) const;
  // Parks `seq` under `key` (replacing what was parked there). False when it exceeds the
  // per-sequence budget: nothing is kept (its memory is freed with `seq`). Evicts (or offloads)
  // the least recently parked others until the total budget holds it; one larger than the total
  // budget goes to the offload tier at once (false when there is none or it does not take it).
  bool park(uint64_t key, ParkedSequence seq);
  // Takes the sequence parked under `key` out, if any.
  std::optional<ParkedSequence> take(uint64_t key);
  // Puts back what take() returned, at its old place in the eviction order (an admission that did
  // not go through). Not checked against the budgets: it held its place before.
  void put_back(uint64_t key, ParkedSequence seq);
  // Drops the sequence parked under `key` (a deleted or expired session, a failed turn).
  void drop(uint64_t key);
  // Moves the least recently parked sequence to the offload tier, or evicts it when there is none
  // or it does not take it. False when none is parked.
  bool evict_lru();
  // Evicts every parked sequence (counted as evictions), offloading none.
  void clear();

  int32_t count() const { return static_cast<int32_t>(entries_.size()); }
  int32_t pages() const { return pages_; }
  int32_t slots() const { return slots_; }
  int64_t bytes() const { return bytes_; }
  int64_t evictions() const { return evictions_; }  // by budget or memory pressure
  int64_t offloads() const { return offloads_; }    // moved to the offload tier instead
  bool contains(uint64_t key) const { return entries_.contains(key); }

 private:
  void insert(uint64_t key, ParkedSequence seq);
  // Hands `s` to the offload tier (the caller frees its ids). False when none takes it.
  bool offload(uint64_t key, const ParkedSequence& s);
  void remove(absl::flat_hash_map<uint64_t, ParkedSequence>::iterator it);

  ParkingBudget budget_;
  SequenceOffload* offload_ = nullptr;
  absl::flat_hash_map<uint64_t, ParkedSequence> entries_;
  std::map<uint64_t, uint64_t> lru_;  // tick -> key, oldest first
  uint64_t clock_ = 0;
  int32_t pages_ = 0, slots_ = 0;
  int64_t bytes_ = 0, evictions_ = 0, offloads_ = 0;
};

}  // namespace loom
