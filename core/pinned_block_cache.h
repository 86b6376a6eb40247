// PinnedBlockCache: page-locked host blocks kept after release for reuse.
//
// Why: pinning memory is slow (cudaHostAlloc locks it page by page; ~0.2-0.4 ms per MiB), and the
// session offload tier (engine/session_offload.h) allocates a blob per offloaded cache and frees
// it when the cache comes back: a 128K-token session's 1.1 GB blob paid that twice a turn. The
// cache hands a released block to the next request that fits it (the smallest free block of at
// least the request's size and less than twice it), so steady-state turns pin nothing.
//
// Blocks are allocated rounded up to kGranule so that near sizes share them. Free blocks are
// kept up to `max_free_bytes` in total; past it the largest go back to the system first (the
// ones most likely to be oversized for the next request). Thread-safe.
#pragma once

#include <cstddef>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"

namespace loom {

class PinnedBlockCache {
 public:
  using AllocFn = void* (*)(size_t bytes);  // nullptr on failure
  using FreeFn = void (*)(void* p);
  static constexpr size_t kGranule = size_t{2} << 20;

  PinnedBlockCache(AllocFn alloc, FreeFn free, size_t max_free_bytes);
  ~PinnedBlockCache();  // frees every block (callers must have released theirs)
  PinnedBlockCache(const PinnedBlockCache&) = delete;
  PinnedBlockCache& operator=(const PinnedBlockCache&) = delete;

  // A block of at least `bytes`; nullptr when the system allocation fails (after giving the free
  // blocks back and trying once more).
  void* allocate(size_t bytes);
  // `p` from allocate(), now unused.
  void release(void* p);

  struct Stats {
    size_t system_allocations = 0;  // AllocFn calls that succeeded
    size_t reuses = 0;              // allocate() calls served from a free block
    size_t free_bytes = 0, used_bytes = 0;
  };
  Stats stats() const;

 private:
  // Takes the largest free blocks out until the free bytes are at most max_free; the caller
  // frees them (`freed`) once the lock is released.
  void trim_locked(size_t max_free, std::vector<void*>& freed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const AllocFn alloc_;
  const FreeFn free_fn_;
  const size_t max_free_bytes_;
  mutable std::mutex mu_;
  std::unordered_map<void*, size_t> size_of_ ABSL_GUARDED_BY(mu_);  // live blocks, used or free
  std::multimap<size_t, void*> free_ ABSL_GUARDED_BY(mu_);          // free blocks by size
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loom
