// Prefix cache for hybrid models: a chain of 64-token (page_size) blocks keyed by
// hash(parent hash, block tokens). An entry (one block) holds the block's KV page when the model
// has attention layers, and optionally a linear-attention state checkpoint taken at the block's end
// when the model has linear layers. Hits compare the block tokens and the parent entry too, so a
// hash collision can never return another prefix's data (it only costs a miss).
//
// Ownership: entries hold IdPool::Handle references; a request reusing a prefix takes its own
// shares (`Match`), so evicting an entry never frees memory still in use. An entry is "in use"
// while any of its ids has another holder; eviction picks the least recently used entry that is not
// in use (leaves first for pages, so chains stay connected).
//
// Thread-safety: none; owned by the engine loop thread with the scheduler.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "scheduler/id_pool.h"

namespace loom {

struct BlockHash {
  uint64_t lo = 0;
  uint64_t hi = 0;
  friend bool operator==(const BlockHash&, const BlockHash&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const BlockHash& b) {
    return H::combine(std::move(h), b.lo, b.hi);
  }
};

// hash(parent, block tokens). The default is 128-bit MurmurHash3-style mixing; tests inject weak
// ones to prove collision safety.
using BlockHashFn = BlockHash (*)(const BlockHash& parent, std::span<const int32_t> tokens);
BlockHash block_hash_default(const BlockHash& parent, std::span<const int32_t> tokens);
inline constexpr BlockHash kRootBlockHash{0x9e3779b97f4a7c15ull, 0x6a09e667f3bcc908ull};

struct PrefixCacheOptions {
  int32_t block_size = 64;      // tokens per block == KV page size
  bool has_pages = true;        // model has attention layers: entries hold pages
  bool has_checkpoints = true;  // model has linear layers: hits need a state checkpoint
  BlockHashFn hash = nullptr;   // nullptr: block_hash_default
};

class PrefixCache {
 public:
  explicit PrefixCache(const PrefixCacheOptions& options);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // Appends the chain hashes of the full blocks of `tokens` to `hashes`, starting after the blocks
  // already in `hashes` (so callers extend incrementally).
  void hash_blocks(std::span<const int32_t> tokens, std::vector<BlockHash>* hashes) const;

  struct Match {
    int32_t length = 0;                 // tokens covered, multiple of block_size, < tokens.size()
    std::vector<IdPool::Handle> pages;  // length / block_size shares (empty without pages)
    IdPool::Handle checkpoint;          // state at `length` (empty without checkpoints or on miss)
  };
  // Longest reusable prefix of `tokens`: every block's page exists and, with checkpoints, a
  // checkpoint exists at exactly the prefix end. Leaves at least one token to compute. Touches the
  // matched entries for LRU. `hashes` are from hash_blocks (at least the full blocks of tokens).
  Match match(std::span<const int32_t> tokens, std::span<const BlockHash> hashes);
  Match match(std::span<const int32_t> tokens);

  // Inserts the first `num_blocks` blocks of `tokens` (whose KV is computed). `pages[i]` is the
  // caller's page for block i (ignored without pages; REQUIRES pages.size() >= num_blocks with
  // pages); shares are taken only for newly created entries. `checkpoint`, if valid, is the state
  // at num_blocks * block_size and is kept unless that entry already has one or cannot be created
  // (collision). Returns the number of blocks now reachable along this chain.
  int32_t insert(std::span<const int32_t> tokens, std::span<const BlockHash> hashes,
                 int32_t num_blocks, std::span<const IdPool::Handle> pages,
                 IdPool::Handle checkpoint);

  // Evicts the least recently used leaf entry whose page only the cache holds. False if none.
  bool evict_for_page();
  // Drops the least recently used checkpoint that only the cache holds (pruning entries left
  // useless). False if none.
  bool evict_for_slot();
  // Pages that eviction could free now: entries whose page only the cache references (an upper
  // bound when such an entry sits above an in-use one). O(entries).
  int32_t count_evictable_pages() const;
  // Whether evict_for_slot() would succeed.
  bool has_evictable_checkpoint() const;
  // Drops every entry (shares held by requests stay valid).
  void clear();

  int32_t num_entries() const;
  // Calls fn(page id or -1, checkpoint slot or -1, block index) for every entry; for ownership
  // audits in tests.
  void for_each_entry(const std::function<void(int32_t, int32_t, int32_t)>& fn) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom
