#include "engine/session_offload.h"

#include "core/status.h"

namespace loom {

bool SessionOffload::offload(uint64_t key, std::span<const int32_t> pages, int32_t slot,
                             int32_t num_computed) {
  HostCacheTier::Info info;
  info.num_computed = num_computed;
  info.num_pages = static_cast<int32_t>(pages.size());
  info.has_slot = slot >= 0;
  return tier_->put(key, info, store_.sequence_bytes(info.num_pages, info.has_slot),
                    [&](void* dst) { store_.save_sequence(pages, slot, dst); });
}

std::optional<SequenceOffload::Held> SessionOffload::hold(uint64_t key) {
  const std::optional<HostCacheTier::Info> info = tier_->hold(key);
  if (!info) return std::nullopt;
  return Held{
      .num_computed = info->num_computed, .num_pages = info->num_pages, .has_slot = info->has_slot};
}

bool SessionOffload::restore(uint64_t key, std::span<const int32_t> pages, int32_t slot) {
  const std::optional<HostCacheTier::Info> info = tier_->hold(key);
  LOOM_CHECK(info && info->num_pages == static_cast<int32_t>(pages.size()) &&
                 info->has_slot == (slot >= 0),
             "SessionOffload::restore of sequence %llu: %zu pages and slot %d for what was "
             "offloaded",
             static_cast<unsigned long long>(key), pages.size(), slot);
  return tier_->take(key, [&](const void* src) { store_.load_sequence(src, pages, slot); });
}

}  // namespace loom
