// SessionOffload: the scheduler's offload tier (scheduler/sequence_offload.h) for the engine's
// CacheStore. A parked session sequence's pages and state slot are packed into a blob of a
// HostCacheTier (CacheStore::save_sequence, copies enqueued on the store's stream, so they land
// before the step's forward overwrites the freed pages) and unpacked into the pages and slot the
// scheduler allocates for the session's next turn (CacheStore::load_sequence), byte for byte:
// the turn continues exactly as if its sequence had stayed parked.
//
// The prefix cache's evicted pages and checkpoints (scheduler/prefix_cache.h) go through a second
// instance over a tier of their own, one page or one slot per blob, packed the same way.
//
// Thread-safety: none; the engine loop thread's (through the scheduler).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>

#include "engine/model/cache_store.h"
#include "engine/model/host_cache_tier.h"
#include "scheduler/sequence_offload.h"

namespace loom {

class SessionOffload final : public SequenceOffload {
 public:
  // `store` must outlive this.
  SessionOffload(CacheStore& store, std::unique_ptr<HostCacheTier> tier)
      : store_(store), tier_(std::move(tier)) {}

  bool offload(uint64_t key, std::span<const int32_t> pages, int32_t slot,
               int32_t num_computed) override;
  std::optional<Held> hold(uint64_t key) override;
  void release(uint64_t key) override { tier_->release(key); }
  bool restore(uint64_t key, std::span<const int32_t> pages, int32_t slot) override;
  void drop(uint64_t key) override { tier_->drop(key); }
  void clear() override { tier_->clear(); }
  std::vector<uint64_t> take_evicted() override { return tier_->take_evicted(); }

  const HostCacheTier& tier() const { return *tier_; }

 private:
  CacheStore& store_;
  std::unique_ptr<HostCacheTier> tier_;
};

}  // namespace loom
