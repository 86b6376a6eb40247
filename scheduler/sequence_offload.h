// SequenceOffload: the tier below the device pools that a parked sequence (parked_sequences.h)
// moves to instead of being evicted, and (an instance of its own) where the prefix cache's evicted
// pages and checkpoints go (prefix_cache.h: one page or one slot per key). The scheduler speaks to
// it in ids only: which pages and which state slot hold the sequence; the implementation
// (engine/session_offload.h) copies their contents out before the scheduler frees the ids, and back
// into ids the scheduler allocated when the session's next turn is admitted. Copies are enqueued in
// stream order while the scheduler plans, so they land before the step's forward reuses or reads
// those pages.
//
// Thread-safety: none; called by the scheduler on the engine loop thread.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace loom {

class SequenceOffload {
 public:
  virtual ~SequenceOffload() = default;

  // Copies the contents of `pages` and of state slot `slot` (-1: none) of the sequence parked
  // under `key` out, with its length. True when they are kept (the caller then frees the ids);
  // false when the tier cannot hold them (the sequence is evicted: its next turn recomputes).
  virtual bool offload(uint64_t key, std::span<const int32_t> pages, int32_t slot,
                       int32_t num_computed) = 0;

  // What an offloaded sequence needs back: its length, its page count, whether it has a slot.
  struct Held {
    int32_t num_computed = 0;
    int32_t num_pages = 0;
    bool has_slot = false;
  };
  // The sequence offloaded under `key`, if any, kept from the tier's own eviction until restore()
  // or release() (the allocations that make room for it may offload others).
  virtual std::optional<Held> hold(uint64_t key) = 0;
  // Ends a hold() without restoring: the sequence stays offloaded.
  virtual void release(uint64_t key) = 0;
  // Copies the held sequence into `pages` (Held::num_pages of them, freshly allocated) and state
  // slot `slot`, and forgets it. False when its bytes are lost (a missing or corrupt disk file):
  // nothing usable was written, the sequence is forgotten and its turn recomputes.
  virtual bool restore(uint64_t key, std::span<const int32_t> pages, int32_t slot) = 0;
  // Forgets the sequence offloaded under `key` (no-op when none is).
  virtual void drop(uint64_t key) = 0;
  // Forgets every offloaded sequence.
  virtual void clear() = 0;
  // The keys the tier dropped on its own (its budgets) since the last call, for an owner that
  // indexes what it offloaded (the prefix cache); a tier that does not report them returns none
  // (the owner then finds out at hold()).
  virtual std::vector<uint64_t> take_evicted() { return {}; }
};

}  // namespace loom
