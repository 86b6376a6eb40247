#include "scheduler/prefix_cache.h"

#include <algorithm>
#include <cstring>
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
    IdPool::Handle page;        // valid iff options.has_pages
    IdPool::Handle checkpoint;  // state after this block, optional
    int32_t num_children = 0;
    uint64_t tick = 0;  // last use, for LRU
    bool live = false;
  };
  static constexpr int32_t kAbsent = -1;
  static constexpr int32_t kCollision = -2;

  PrefixCacheOptions opt;
  std::vector<Node> nodes;
  std::vector<int32_t> free_nodes;
  absl::flat_hash_map<BlockHash, int32_t> index;
  std::set<std::pair<uint64_t, int32_t>> leaves;  // live leaves by tick
  std::set<std::pair<uint64_t, int32_t>> ckpts;   // nodes holding a checkpoint, by tick
  uint64_t clock = 0;

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

  void set_tick(int32_t i, uint64_t t) {
    Node& n = nodes[i];
    if (n.num_children == 0) leaves.erase({n.tick, i});
    if (n.checkpoint.valid()) ckpts.erase({n.tick, i});
    n.tick = t;
    if (n.num_children == 0) leaves.insert({n.tick, i});
    if (n.checkpoint.valid()) ckpts.insert({n.tick, i});
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
    n.page = std::move(page);
    n.num_children = 0;
    n.tick = clock;
    n.live = true;
    index.emplace(key, i);
    leaves.insert({n.tick, i});
    if (parent >= 0) {
      Node& p = nodes[parent];
      if (p.num_children++ == 0) leaves.erase({p.tick, parent});
    }
    return i;
  }

  // REQUIRES: i is a live leaf.
  void remove(int32_t i) {
    Node& n = nodes[i];
    LOOM_CHECK(n.live && n.num_children == 0, "remove of node %d (children %d)", i, n.num_children);
    leaves.erase({n.tick, i});
    if (n.checkpoint.valid()) ckpts.erase({n.tick, i});
    index.erase(n.key);
    n.page.reset();
    n.checkpoint.reset();
    n.tokens.clear();
    n.live = false;
    if (n.parent >= 0) {
      Node& p = nodes[n.parent];
      if (--p.num_children == 0) leaves.insert({p.tick, n.parent});
    }
    free_nodes.push_back(i);
  }

  // A leaf holding nothing (no pages in this model, no checkpoint) serves no match.
  bool useless(int32_t i) const {
    const Node& n = nodes[i];
    return n.num_children == 0 && !n.page.valid() && !n.checkpoint.valid();
  }
  void prune_up(int32_t i) {
    while (i >= 0 && useless(i)) {
      const int32_t p = nodes[i].parent;
      remove(i);
      i = p;
    }
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
    path.push_back(i);
    cur = i;
    if (!m.opt.has_checkpoints || m.nodes[i].checkpoint.valid()) best = b + 1;
  }
  if (best == 0) return out;
  const uint64_t t = ++m.clock;
  for (int32_t b = 0; b < best; ++b) m.set_tick(path[b], t);
  out.length = best * m.opt.block_size;
  if (m.opt.has_pages) {
    out.pages.reserve(best);
    for (int32_t b = 0; b < best; ++b) out.pages.push_back(m.nodes[path[b]].page.share());
  }
  if (m.opt.has_checkpoints) out.checkpoint = m.nodes[path[best - 1]].checkpoint.share();
  return out;
}

int32_t PrefixCache::insert(std::span<const int32_t> tokens, std::span<const BlockHash> hashes,
                            int32_t num_blocks, std::span<const IdPool::Handle> pages,
                            IdPool::Handle checkpoint) {
  Impl& m = *impl_;
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
    }
    m.set_tick(i, t);
    cur = i;
    reached = b + 1;
  }
  if (cur >= 0 && reached == num_blocks && m.opt.has_checkpoints && checkpoint.valid() &&
      !m.nodes[cur].checkpoint.valid()) {
    m.nodes[cur].checkpoint = std::move(checkpoint);
    m.ckpts.insert({m.nodes[cur].tick, cur});
  }
  m.prune_up(cur);
  return reached;
}

bool PrefixCache::evict_for_page() {
  Impl& m = *impl_;
  for (const auto& entry : m.leaves) {
    const int32_t i = entry.second;
    const Impl::Node& n = m.nodes[i];
    if (n.page.valid() && n.page.use_count() == 1) {
      m.remove(i);
      return true;
    }
  }
  return false;
}

bool PrefixCache::evict_for_slot() {
  Impl& m = *impl_;
  for (auto it = m.ckpts.begin(); it != m.ckpts.end(); ++it) {
    const int32_t i = it->second;
    Impl::Node& n = m.nodes[i];
    if (n.checkpoint.use_count() == 1) {
      m.ckpts.erase(it);  // invalidates the loop; we return right after
      n.checkpoint.reset();
      m.prune_up(i);
      return true;
    }
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
}

int32_t PrefixCache::num_entries() const { return static_cast<int32_t>(impl_->index.size()); }

void PrefixCache::for_each_entry(const std::function<void(int32_t, int32_t, int32_t)>& fn) const {
  for (const Impl::Node& n : impl_->nodes) {
    if (n.live) fn(n.page.id(), n.checkpoint.id(), n.block);
  }
}

}  // namespace loom
