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
// Offload (PrefixCacheOptions::offload, optional): an evicted page or checkpoint is copied to the
// offload tier instead of dropped, and its entry stays in the chain, holding the tokens and parent
// a hit compares as before; a page counts as a leaf's once no child holds its page on the device.
// A match that reaches such entries reports them, and restore() copies them back into fresh ids
// (so the prefix is not recomputed). Each blob is keyed by its entry's serial number (never
// reused) and kind, so a key names one block of one chain and nothing else. A blob the tier
// dropped (its budget; take_evicted()) or lost is forgotten: the chain ends there (an entry
// without its page is a hole until an insert brings the page again), and the prefix past it is
// recomputed. Without offload the cache behaves exactly as it did without this feature.
//
// Thread-safety: none; owned by the engine loop thread with the scheduler.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "scheduler/id_pool.h"
#include "scheduler/sequence_offload.h"

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
  // Where evicted pages and checkpoints go (one blob each); null: they are dropped. The cache owns
  // every key of that tier; it must outlive the cache.
  SequenceOffload* offload = nullptr;
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
    int32_t length = 0;  // tokens covered, multiple of block_size, < tokens.size()
    // length / block_size shares (empty without pages); an empty handle where the block's page is
    // in the offload tier (restore()).
    std::vector<IdPool::Handle> pages;
    // State at `length` (empty without checkpoints or on miss, or while it is offloaded).
    IdPool::Handle checkpoint;
    int32_t offloaded_pages = 0;        // empty handles in `pages`
    bool offloaded_checkpoint = false;  // the checkpoint at `length` is in the offload tier
    std::vector<int32_t> entries;       // the matched entries, for restore()
    // Tokens of the longest chain of cached blocks the tokens begin with (their pages present or
    // offloaded), checkpoint or not: >= length. Beyond `length` they were computed by an earlier
    // request that went on differently (a shared system prompt) or whose checkpoint was evicted:
    // a checkpoint there would let the next request sharing them hit (the scheduler places one).
    int32_t shared_length = 0;
  };
  // Longest reusable prefix of `tokens`: every block's page exists and, with checkpoints, a
  // checkpoint exists at exactly the prefix end (on the device or, with offload, in the tier).
  // Leaves at least one token to compute. Touches the matched entries for LRU. `hashes` are from
  // hash_blocks (at least the full blocks of tokens).
  Match match(std::span<const int32_t> tokens, std::span<const BlockHash> hashes);
  Match match(std::span<const int32_t> tokens);

  // Fresh ids for restore(): the scheduler's allocators, which may evict (from this cache too:
  // never the match's entries, which it holds). An empty handle: none can be had.
  struct Allocators {
    std::function<IdPool::Handle()> page;
    std::function<IdPool::Handle()> slot;
  };
  // Copies the offloaded pages and checkpoint of `m` back into ids from `alloc`, which the entries
  // then hold again (and `m` shares). When a blob is lost or an id cannot be had, `m` is cut to the
  // longest prefix it can serve without them (maybe 0 tokens). Afterwards every handle of `m` is
  // valid and its offloaded_* are 0. REQUIRES: `m` is from match() with no call in between.
  void restore(Match* m, const Allocators& alloc);

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

  // Since the cache was created: blobs moved to the offload tier (pages and checkpoints), copied
  // back (restore() calls that copied any: hits), and forgotten because the tier dropped or lost
  // them.
  struct OffloadStats {
    int64_t offloaded = 0;
    int64_t restored_pages = 0, restored_checkpoints = 0, hits = 0;
    int64_t lost = 0;
  };
  const OffloadStats& offload_stats() const;

  int32_t num_entries() const;  // entries whose page or checkpoint is offloaded included
  // Calls fn(page id or -1, checkpoint slot or -1, block index) for every entry; for ownership
  // audits in tests.
  void for_each_entry(const std::function<void(int32_t, int32_t, int32_t)>& fn) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom
