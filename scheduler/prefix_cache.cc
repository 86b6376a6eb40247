#include "scheduler/prefix_cache.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "core/status.h"

namespace loom {
namespace {

inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t fmix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ull;
  k ^= k >> 33;
  return k;
}

}  // namespace

// MurmurHash3_x64_128's mixing over the words (parent.lo, parent.hi, token pairs...), seeded with
// fixed constants. Not cryptographic; hits still compare tokens, so collisions only cost misses.
BlockHash block_hash_default(const BlockHash& parent, std::span<const int32_t> tokens) {
  constexpr uint64_t c1 = 0x87c37b91114253d5ull, c2 = 0x4cf5ad432745937full;
  uint64_t h1 = 0x243f6a8885a308d3ull, h2 = 0x13198a2e03707344ull;
  auto mix = [&](uint64_t k1, uint64_t k2) {
    k1 *= c1, k1 = rotl64(k1, 31), k1 *= c2, h1 ^= k1;
    h1 = rotl64(h1, 27), h1 += h2, h1 = h1 * 5 + 0x52dce729;
    k2 *= c2, k2 = rotl64(k2, 33), k2 *= c1, h2 ^= k2;
    h2 = rotl64(h2, 31), h2 += h1, h2 = h2 * 5 + 0x38495ab5;
  };
  mix(parent.lo, parent.hi);
  size_t i = 0;
  for (; i + 4 <= tokens.size(); i += 4) {
    const uint64_t k1 = static_cast<uint32_t>(tokens[i]) |
                        (static_cast<uint64_t>(static_cast<uint32_t>(tokens[i + 1])) << 32);
    const uint64_t k2 = static_cast<uint32_t>(tokens[i + 2]) |
                        (static_cast<uint64_t>(static_cast<uint32_t>(tokens[i + 3])) << 32);
    mix(k1, k2);
  }
  uint32_t tail[4] = {0, 0, 0, 0};
  for (size_t j = 0; i + j < tokens.size(); ++j) tail[j] = static_cast<uint32_t>(tokens[i + j]);
  mix(tail[0] | (static_cast<uint64_t>(tail[1]) << 32),
      tail[2] | (static_cast<uint64_t>(tail[3]) << 32));
  const uint64_t len = tokens.size();
  h1 ^= len, h2 ^= len;
  h1 += h2, h2 += h1;
  h1 = fmix64(h1), h2 = fmix64(h2);
  h1 += h2, h2 += h1;
  return BlockHash{h1, h2};
}

struct PrefixCache::Impl {
  struct Node {
    BlockHash key;
    int32_t parent = -1;  // node index; -1: the root (empty prefix)
    int32_t block = 0;    // block index in the chain (depth)
    std::vector<int32_t> tokens;
    IdPool::Handle page;        // with options.has_pages: the page, unless offloaded (or a hole)
    IdPool::Handle checkpoint;  // state after this block, optional
    int32_t num_children = 0;
    int32_t num_resident = 0;  // children holding their page on the device
    uint64_t tick = 0;         // last use, for LRU
    uint64_t serial = 0;       // unique for the cache's life: the entry's offload keys
    bool page_out = false;     // the page is in the offload tier
    bool ckpt_out = false;     // the checkpoint is
    bool live = false;
  };
  static constexpr int32_t kAbsent = -1;
  static constexpr int32_t kCollision = -2;
  enum Kind : uint64_t { kPage = 0, kCheckpoint = 1 };
  static uint64_t blob_key(const Node& n, Kind k) { return n.serial << 1 | k; }

  PrefixCacheOptions opt;
  std::vector<Node> nodes;
  std::vector<int32_t> free_nodes;
  absl::flat_hash_map<BlockHash, int32_t> index;
  // Nodes holding a page no child holds on the device (without offload: live leaves), by tick.
  std::set<std::pair<uint64_t, int32_t>> leaves;
  std::set<std::pair<uint64_t, int32_t>> ckpts;      // nodes holding a checkpoint, by tick
  absl::flat_hash_map<uint64_t, int32_t> offloaded;  // blob key -> node
  uint64_t clock = 0;
  uint64_t next_serial = 1;
  OffloadStats stats;

  std::span<const int32_t> block_tokens(std::span<const int32_t> tokens, int32_t b) const {
    return tokens.subspan(static_cast<size_t>(b) * opt.block_size, opt.block_size);
  }

  int32_t find(const BlockHash& key, int32_t parent, std::span<const int32_t> toks) const {
    auto it = index.find(key);
    if (it == index.end()) return kAbsent;
    const Node& n = nodes[it->second];
    if (n.parent != parent ||
        !std::equal(toks.begin(), toks.end(), n.tokens.begin(), n.tokens.end())) {
      return kCollision;
    }
    return it->second;
  }

  // The eviction orders hold a node by what it holds; every change goes unlink, change, link.
  void unlink(int32_t i) {
    const Node& n = nodes[i];
    if (n.page.valid() && n.num_resident == 0) leaves.erase({n.tick, i});
    if (n.checkpoint.valid()) ckpts.erase({n.tick, i});
  }
  void link(int32_t i) {
    const Node& n = nodes[i];
    if (n.page.valid() && n.num_resident == 0) leaves.insert({n.tick, i});
    if (n.checkpoint.valid()) ckpts.insert({n.tick, i});
  }

  void set_tick(int32_t i, uint64_t t) {
    unlink(i);
    nodes[i].tick = t;
    link(i);
  }
  void set_page(int32_t i, IdPool::Handle page) {
    const bool was = nodes[i].page.valid();
    unlink(i);
    nodes[i].page = std::move(page);
    link(i);
    const bool now = nodes[i].page.valid();
    const int32_t p = nodes[i].parent;
    if (was != now && p >= 0) {
      unlink(p);
      nodes[p].num_resident += now ? 1 : -1;
      link(p);
    }
  }
  void set_checkpoint(int32_t i, IdPool::Handle ckpt) {
    unlink(i);
    nodes[i].checkpoint = std::move(ckpt);
    link(i);
  }

  int32_t create(int32_t parent, const BlockHash& key, std::span<const int32_t> toks, int32_t block,
                 IdPool::Handle page) {
    int32_t i;
    if (!free_nodes.empty()) {
      i = free_nodes.back();
      free_nodes.pop_back();
    } else {
      i = static_cast<int32_t>(nodes.size());
      nodes.emplace_back();
    }
    Node& n = nodes[i];
    n.key = key;
    n.parent = parent;
    n.block = block;
    n.tokens.assign(toks.begin(), toks.end());
    n.num_children = 0;
    n.num_resident = 0;
    n.tick = clock;
    n.serial = next_serial++;
    n.page_out = n.ckpt_out = false;
    n.live = true;
    index.emplace(key, i);
    if (parent >= 0) ++nodes[parent].num_children;
    set_page(i, std::move(page));
    return i;
  }

  // REQUIRES: i is a live node without children.
  void remove(int32_t i) {
    Node& n = nodes[i];
    LOOM_CHECK(n.live && n.num_children == 0, "remove of node %d (children %d)", i, n.num_children);
    if (n.page_out) drop_blob(i, kPage);
    if (n.ckpt_out) drop_blob(i, kCheckpoint);
    set_page(i, IdPool::Handle());
    set_checkpoint(i, IdPool::Handle());
    index.erase(n.key);
    n.tokens.clear();
    n.live = false;
    if (n.parent >= 0) --nodes[n.parent].num_children;
    free_nodes.push_back(i);
  }

  // A leaf holding nothing (no pages in this model, no checkpoint) serves no match.
  bool useless(int32_t i) const {
    const Node& n = nodes[i];
    return n.live && n.num_children == 0 && !n.page.valid() && !n.page_out &&
           !n.checkpoint.valid() && !n.ckpt_out;
  }
  void prune_up(int32_t i) {
    while (i >= 0 && useless(i)) {
      const int32_t p = nodes[i].parent;
      remove(i);
      i = p;
    }
  }

  // Moves node i's page or checkpoint (which only the cache holds) to the offload tier. False
  // when there is none or it does not take the blob (the caller drops it).
  bool offload_blob(int32_t i, Kind k) {
    if (opt.offload == nullptr) return false;
    Node& n = nodes[i];
    const int32_t page = k == kPage ? n.page.id() : -1;
    const int32_t slot = k == kCheckpoint ? n.checkpoint.id() : -1;
    const auto pages = page >= 0 ? std::span<const int32_t>(&page, 1) : std::span<const int32_t>();
    if (!opt.offload->offload(blob_key(n, k), pages, slot, (n.block + 1) * opt.block_size))
      return false;
    offloaded.emplace(blob_key(n, k), i);
    if (k == kPage) {
      set_page(i, IdPool::Handle());
      n.page_out = true;
    } else {
      set_checkpoint(i, IdPool::Handle());
      n.ckpt_out = true;
    }
    ++stats.offloaded;
    return true;
  }
  // Forgets node i's blob of kind k (the tier's copy too); the node may become useless.
  void drop_blob(int32_t i, Kind k) {
    Node& n = nodes[i];
    (k == kPage ? n.page_out : n.ckpt_out) = false;
    offloaded.erase(blob_key(n, k));
    opt.offload->drop(blob_key(n, k));
  }
  // Forgets the blobs the tier dropped on its own since the last call, pruning what they leave
  // useless. Called only at the start of match() and insert(), never during restore().
  void forget_evicted() {
    if (opt.offload == nullptr) return;
    for (uint64_t key : opt.offload->take_evicted()) {
      auto it = offloaded.find(key);
      if (it == offloaded.end()) continue;
      const int32_t i = it->second;
      drop_blob(i, static_cast<Kind>(key & 1));
      ++stats.lost;
      prune_up(i);
    }
  }

  // Cuts `m` to the longest prefix its valid handles serve (restore()'s fallback).
  void cut(Match* m) const {
    int32_t best = 0;
    for (size_t b = 0; b < m->entries.size(); ++b) {
      if (opt.has_pages && !m->pages[b].valid()) break;
      if (!opt.has_checkpoints || nodes[m->entries[b]].checkpoint.valid())
        best = static_cast<int32_t>(b) + 1;
    }
    m->length = best * opt.block_size;
    m->entries.resize(best);
    if (opt.has_pages) m->pages.resize(best);
    m->checkpoint = opt.has_checkpoints && best > 0 ? nodes[m->entries[best - 1]].checkpoint.share()
                                                    : IdPool::Handle();
  }
};

PrefixCache::PrefixCache(const PrefixCacheOptions& options) : impl_(std::make_unique<Impl>()) {
  LOOM_CHECK(options.block_size > 0, "block_size %d", options.block_size);
  impl_->opt = options;
  if (!impl_->opt.hash) impl_->opt.hash = block_hash_default;
}

PrefixCache::~PrefixCache() = default;

void PrefixCache::hash_blocks(std::span<const int32_t> tokens,
                              std::vector<BlockHash>* hashes) const {
  const size_t bs = impl_->opt.block_size;
  const size_t full = tokens.size() / bs;
  for (size_t b = hashes->size(); b < full; ++b) {
    const BlockHash parent = b == 0 ? kRootBlockHash : (*hashes)[b - 1];
    hashes->push_back(impl_->opt.hash(parent, tokens.subspan(b * bs, bs)));
  }
}

PrefixCache::Match PrefixCache::match(std::span<const int32_t> tokens) {
  std::vector<BlockHash> hashes;
  hash_blocks(tokens, &hashes);
  return match(tokens, hashes);
}

PrefixCache::Match PrefixCache::match(std::span<const int32_t> tokens,
                                      std::span<const BlockHash> hashes) {
  Impl& m = *impl_;
  m.forget_evicted();
  Match out;
  if (tokens.empty()) return out;
  const int32_t max_blocks = static_cast<int32_t>((tokens.size() - 1) / m.opt.block_size);
  LOOM_CHECK(hashes.size() >= static_cast<size_t>(max_blocks), "%zu hashes for %d blocks",
             hashes.size(), max_blocks);
  std::vector<int32_t> path;
  int32_t best = 0;
  int32_t cur = -1;
  for (int32_t b = 0; b < max_blocks; ++b) {
    const int32_t i = m.find(hashes[b], cur, m.block_tokens(tokens, b));
    if (i < 0) break;
    const Impl::Node& n = m.nodes[i];
    if (m.opt.has_pages && !n.page.valid() && !n.page_out) break;  // a hole
    path.push_back(i);
    cur = i;
    if (!m.opt.has_checkpoints || n.checkpoint.valid() || n.ckpt_out) best = b + 1;
  }
  out.shared_length = static_cast<int32_t>(path.size()) * m.opt.block_size;
  if (best == 0) return out;
  const uint64_t t = ++m.clock;
  for (int32_t b = 0; b < best; ++b) m.set_tick(path[b], t);
  out.length = best * m.opt.block_size;
  out.entries.assign(path.begin(), path.begin() + best);
  if (m.opt.has_pages) {
    out.pages.reserve(best);
    for (int32_t b = 0; b < best; ++b) {
      out.pages.push_back(m.nodes[path[b]].page.share());
      out.offloaded_pages += !out.pages.back().valid();
    }
  }
  if (m.opt.has_checkpoints) {
    out.checkpoint = m.nodes[path[best - 1]].checkpoint.share();
    out.offloaded_checkpoint = !out.checkpoint.valid();
  }
  return out;
}

void PrefixCache::restore(Match* out, const Allocators& alloc) {
  Impl& m = *impl_;
  if (out->offloaded_pages == 0 && !out->offloaded_checkpoint) return;
  SequenceOffload& tier = *m.opt.offload;
  // The blobs wanted, held first: the allocations below may offload others, which must not push
  // these out of the tier. A blob not there as the entry says, or not of its shape, is lost.
  struct Want {
    int32_t block;
    Impl::Kind kind;
    uint64_t key;
  };
  std::vector<Want> wants;
  for (size_t b = 0; b < out->pages.size(); ++b) {
    if (!out->pages[b].valid()) {
      const int32_t i = out->entries[b];
      wants.push_back({static_cast<int32_t>(b), Impl::kPage, m.blob_key(m.nodes[i], Impl::kPage)});
    }
  }
  if (out->offloaded_checkpoint) {
    const int32_t last = static_cast<int32_t>(out->entries.size()) - 1;
    wants.push_back(
        {last, Impl::kCheckpoint, m.blob_key(m.nodes[out->entries[last]], Impl::kCheckpoint)});
  }
  std::vector<int32_t> lost;  // entries that lost a blob: pruned once `out` no longer needs them
  auto lose = [&](const Want& w) {
    m.drop_blob(out->entries[w.block], w.kind);
    ++m.stats.lost;
    lost.push_back(out->entries[w.block]);
  };
  // Wants are in block order, the checkpoint last: those held before a lost one still come back.
  bool whole = true;
  size_t held = 0;
  for (; held < wants.size(); ++held) {
    const Want& w = wants[held];
    const std::optional<SequenceOffload::Held> h = tier.hold(w.key);
    const bool page = w.kind == Impl::kPage;
    if (!h || h->num_pages != (page ? 1 : 0) || h->has_slot == page) {
      if (h) tier.release(w.key);
      lose(w);
      whole = false;
      break;
    }
  }
  int64_t restored = 0;
  for (size_t k = 0; k < held; ++k) {
    const Want& w = wants[k];
    const int32_t i = out->entries[w.block];
    const bool page = w.kind == Impl::kPage;
    IdPool::Handle id = page ? alloc.page() : alloc.slot();
    if (!id.valid()) {
      whole = false;
      break;
    }
    const int32_t one = id.id();
    const bool back = page ? tier.restore(w.key, std::span<const int32_t>(&one, 1), -1)
                           : tier.restore(w.key, {}, one);
    if (!back) {  // the tier lost it (nothing usable was written)
      lose(w);
      whole = false;
      break;
    }
    m.offloaded.erase(w.key);
    if (page) {
      m.nodes[i].page_out = false;
      m.set_page(i, id.share());
      out->pages[w.block] = std::move(id);
      ++m.stats.restored_pages;
    } else {
      m.nodes[i].ckpt_out = false;
      m.set_checkpoint(i, id.share());
      out->checkpoint = std::move(id);
      ++m.stats.restored_checkpoints;
    }
    ++restored;
  }
  for (size_t k = 0; k < held; ++k) {
    if (m.offloaded.contains(wants[k].key)) tier.release(wants[k].key);
  }
  if (restored > 0) ++m.stats.hits;
  out->offloaded_pages = 0;
  out->offloaded_checkpoint = false;
  if (!whole) m.cut(out);
  for (int32_t i : lost) m.prune_up(i);
}

int32_t PrefixCache::insert(std::span<const int32_t> tokens, std::span<const BlockHash> hashes,
                            int32_t num_blocks, std::span<const IdPool::Handle> pages,
                            IdPool::Handle checkpoint) {
  Impl& m = *impl_;
  m.forget_evicted();
  LOOM_CHECK(num_blocks >= 0 &&
                 static_cast<size_t>(num_blocks) * m.opt.block_size <= tokens.size() &&
                 hashes.size() >= static_cast<size_t>(num_blocks),
             "num_blocks %d, %zu tokens, %zu hashes", num_blocks, tokens.size(), hashes.size());
  LOOM_CHECK(!m.opt.has_pages || pages.size() >= static_cast<size_t>(num_blocks),
             "%zu pages for %d blocks", pages.size(), num_blocks);
  const uint64_t t = ++m.clock;
  int32_t cur = -1;
  int32_t reached = 0;
  for (int32_t b = 0; b < num_blocks; ++b) {
    int32_t i = m.find(hashes[b], cur, m.block_tokens(tokens, b));
    if (i == Impl::kCollision) break;
    if (i == Impl::kAbsent) {
      IdPool::Handle page = m.opt.has_pages ? pages[b].share() : IdPool::Handle();
      i = m.create(cur, hashes[b], m.block_tokens(tokens, b), b, std::move(page));
    } else if (m.opt.has_pages && !m.nodes[i].page.valid()) {
      // Offloaded (or lost): the caller's page holds the same block; its blob is not needed.
      if (m.nodes[i].page_out) m.drop_blob(i, Impl::kPage);
      m.set_page(i, pages[b].share());
    }
    m.set_tick(i, t);
    cur = i;
    reached = b + 1;
  }
  if (cur >= 0 && reached == num_blocks && m.opt.has_checkpoints && checkpoint.valid() &&
      !m.nodes[cur].checkpoint.valid()) {
    if (m.nodes[cur].ckpt_out) m.drop_blob(cur, Impl::kCheckpoint);
    m.set_checkpoint(cur, std::move(checkpoint));
  }
  m.prune_up(cur);
  return reached;
}

// A page goes to the offload tier, its entry staying; without one (or when it refuses the blob)
// the entry goes, or becomes a hole while offloaded children hang below it.
bool PrefixCache::evict_for_page() {
  Impl& m = *impl_;
  for (const auto& entry : m.leaves) {
    const int32_t i = entry.second;
    if (m.nodes[i].page.use_count() != 1) continue;
    // Each branch changes `leaves`; we return right after.
    if (m.offload_blob(i, Impl::kPage)) return true;
    if (m.nodes[i].num_children > 0) {
      m.set_page(i, IdPool::Handle());
    } else {
      const int32_t p = m.nodes[i].parent;
      m.remove(i);
      m.prune_up(p);
    }
    return true;
  }
  return false;
}

bool PrefixCache::evict_for_slot() {
  Impl& m = *impl_;
  for (const auto& entry : m.ckpts) {
    const int32_t i = entry.second;
    if (m.nodes[i].checkpoint.use_count() != 1) continue;
    // Each branch changes `ckpts`; we return right after.
    if (m.offload_blob(i, Impl::kCheckpoint)) return true;
    m.set_checkpoint(i, IdPool::Handle());
    m.prune_up(i);
    return true;
  }
  return false;
}

int32_t PrefixCache::count_evictable_pages() const {
  int32_t n = 0;
  for (const Impl::Node& node : impl_->nodes) n += node.live && node.page.use_count() == 1;
  return n;
}

bool PrefixCache::has_evictable_checkpoint() const {
  for (const auto& entry : impl_->ckpts) {
    if (impl_->nodes[entry.second].checkpoint.use_count() == 1) return true;
  }
  return false;
}

void PrefixCache::clear() {
  Impl& m = *impl_;
  m.nodes.clear();
  m.free_nodes.clear();
  m.index.clear();
  m.leaves.clear();
  m.ckpts.clear();
  m.offloaded.clear();
  if (m.opt.offload != nullptr) m.opt.offload->clear();
}

const PrefixCache::OffloadStats& PrefixCache::offload_stats() const { return impl_->stats; }

int32_t PrefixCache::num_entries() const { return static_cast<int32_t>(impl_->index.size()); }

void PrefixCache::for_each_entry(const std::function<void(int32_t, int32_t, int32_t)>& fn) const {
  for (const Impl::Node& n : impl_->nodes) {
    if (n.live) fn(n.page.id(), n.checkpoint.id(), n.block);
  }
}

}  // namespace loom
