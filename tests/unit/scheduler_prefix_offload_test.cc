// PrefixCache with an offload tier (prefix_cache.h): evicted pages and checkpoints go to the tier
// (leaves first) and their entries stay; a match reaching them reports them and restore() copies
// them back into fresh ids in block order; blobs the tier drops are forgotten (the match ends
// before them); a blob lost on the way back or an id that cannot be had cuts the match to what is
// on the device, and a later insert refills the hole; any hash, even a constant one, never returns
// another prefix's data; clearing frees every id and empties the tier.
//
// The tier here keeps labels, not bytes: what each page and slot holds is the token prefix it was
// computed for, so a wrong restore shows as a wrong label.
#include <algorithm>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "gtest/gtest.h"
#include "scheduler/id_pool.h"
#include "scheduler/prefix_cache.h"
#include "scheduler/scheduler_testing.h"

namespace loom {
namespace {

constexpr int32_t kBs = 64;
using Labels = absl::flat_hash_map<int32_t, std::vector<int32_t>>;  // id -> token prefix

class LabelTier final : public SequenceOffload {
 public:
  LabelTier(Labels* pages, Labels* slots, int32_t capacity = 1 << 20)
      : pages_(pages), slots_(slots), capacity_(capacity) {}

  bool offload(uint64_t key, std::span<const int32_t> pages, int32_t slot,
               int32_t num_computed) override {
    drop(key);
    while (static_cast<int32_t>(blobs_.size()) >= capacity_) {
      auto it = std::find_if(order_.begin(), order_.end(),
                             [&](const auto& e) { return !blobs_.at(e.second).held; });
      if (it == order_.end()) return false;
      evicted_.push_back(it->second);
      drop(it->second);
    }
    EXPECT_EQ(pages.size() + (slot >= 0 ? 1 : 0), 1u) << "one page or one slot per blob";
    Blob b;
    b.page = !pages.empty();
    b.label = b.page ? pages_->at(pages[0]) : slots_->at(slot);
    EXPECT_EQ(static_cast<int32_t>(b.label.size()), num_computed);
    b.tick = ++tick_;
    order_.emplace(b.tick, key);
    offloaded_blocks.push_back(num_computed / kBs - 1);
    blobs_.emplace(key, std::move(b));
    return true;
  }
  std::optional<Held> hold(uint64_t key) override {
    auto it = blobs_.find(key);
    if (it == blobs_.end()) return std::nullopt;
    it->second.held = true;
    const int32_t n = static_cast<int32_t>(it->second.label.size());
    return Held{n, it->second.page ? 1 : 0, !it->second.page};
  }
  void release(uint64_t key) override {
    if (auto it = blobs_.find(key); it != blobs_.end()) it->second.held = false;
  }
  bool restore(uint64_t key, std::span<const int32_t> pages, int32_t slot) override {
    auto it = blobs_.find(key);
    if (it == blobs_.end()) return false;
    const Blob b = it->second;
    drop(key);
    const int32_t block = static_cast<int32_t>(b.label.size()) / kBs - 1;
    const bool lost = block == lose_block;
    const std::vector<int32_t> label = lost ? std::vector<int32_t>{-1} : b.label;
    if (b.page) {
      EXPECT_EQ(pages.size(), 1u);
      EXPECT_EQ(slot, -1);
      (*pages_)[pages[0]] = label;
      restored_pages.push_back(pages[0]);
    } else {
      EXPECT_TRUE(pages.empty());
      (*slots_)[slot] = label;
    }
    return !lost;
  }
  void drop(uint64_t key) override {
    auto it = blobs_.find(key);
    if (it == blobs_.end()) return;
    order_.erase(it->second.tick);
    blobs_.erase(it);
  }
  void clear() override {
    blobs_.clear();
    order_.clear();
  }
  std::vector<uint64_t> take_evicted() override { return std::exchange(evicted_, {}); }

  int32_t size() const { return static_cast<int32_t>(blobs_.size()); }
  std::vector<int32_t> offloaded_blocks;  // block index of each blob, in offload order
  std::vector<int32_t> restored_pages;    // the ids pages were restored into, in order
  int32_t lose_block = -1;                // restores of this block's blobs report lost bytes

 private:
  struct Blob {
    std::vector<int32_t> label;
    bool page = false;
    uint64_t tick = 0;
    bool held = false;
  };
  Labels* pages_;
  Labels* slots_;
  const int32_t capacity_;
  absl::flat_hash_map<uint64_t, Blob> blobs_;
  std::map<uint64_t, uint64_t> order_;  // tick -> key, oldest first
  std::vector<uint64_t> evicted_;
  uint64_t tick_ = 0;
};

std::vector<int32_t> random_tokens(std::mt19937& rng, int n) {
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % 50000);
  return t;
}

std::vector<int32_t> prefix(const std::vector<int32_t>& tokens, int32_t blocks) {
  return std::vector<int32_t>(tokens.begin(), tokens.begin() + blocks * kBs);
}

// A cache over its own pools, the tier and the labels the pages and slots hold.
struct Rig {
  explicit Rig(bool checkpoints, int32_t capacity = 1 << 20, BlockHashFn hash = nullptr)
      : tier(&page_labels, &slot_labels, capacity),
        cache({.block_size = kBs,
               .has_pages = true,
               .has_checkpoints = checkpoints,
               .hash = hash,
               .offload = &tier}) {}
  // Inserts the full blocks of `tokens` with fresh pages labelled with their prefixes and, if
  // `ckpt_block` > 0, a checkpoint there.
  void insert(const std::vector<int32_t>& tokens, int32_t ckpt_block = 0) {
    std::vector<BlockHash> hashes;
    cache.hash_blocks(tokens, &hashes);
    const int32_t blocks = static_cast<int32_t>(tokens.size()) / kBs;
    std::vector<IdPool::Handle> held;
    ASSERT_TRUE(pages.allocate(blocks, &held));
    for (int32_t b = 0; b < blocks; ++b) page_labels[held[b].id()] = prefix(tokens, b + 1);
    IdPool::Handle ckpt;
    if (ckpt_block > 0) {
      ckpt = slots.allocate_one();
      slot_labels[ckpt.id()] = prefix(tokens, ckpt_block);
      cache.insert(tokens, hashes, ckpt_block, held, std::move(ckpt));
    }
    cache.insert(tokens, hashes, blocks, held, IdPool::Handle());
  }
  PrefixCache::Allocators alloc() {
    return {.page = [this] { return pages.allocate_one(); },
            .slot = [this] { return slots.allocate_one(); }};
  }
  // Every page and the checkpoint of `m` hold the prefix of `tokens` they should.
  void expect_labels(const PrefixCache::Match& m, const std::vector<int32_t>& tokens) {
    for (size_t b = 0; b < m.pages.size(); ++b) {
      EXPECT_EQ(page_labels.at(m.pages[b].id()), prefix(tokens, static_cast<int32_t>(b) + 1))
          << "block " << b;
    }
    if (m.checkpoint.valid()) {
      EXPECT_EQ(slot_labels.at(m.checkpoint.id()), prefix(tokens, m.length / kBs));
    }
  }

  KvPagePool pages{65, kBs};  // 64 beside the scratch page
  StateSlotPool slots{9};     // 8 beside the scratch slot
  Labels page_labels, slot_labels;
  LabelTier tier;
  PrefixCache cache;
};

TEST(PrefixOffload, EvictedPagesGoLeavesFirstAndComeBackInOrder) {
  std::mt19937 rng(1);
  Rig r(/*checkpoints=*/false);
  const auto prompt = random_tokens(rng, 4 * kBs + 5);
  r.insert(prompt);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(r.cache.evict_for_page());
  EXPECT_FALSE(r.cache.evict_for_page()) << "nothing left on the device";
  EXPECT_EQ(r.tier.offloaded_blocks, (std::vector<int32_t>{3, 2, 1, 0})) << "leaves first";
  EXPECT_EQ(r.pages.free_count(), 64);
  EXPECT_EQ(r.cache.num_entries(), 4) << "entries stay, their pages in the tier";
  EXPECT_EQ(r.cache.count_evictable_pages(), 0);

  PrefixCache::Match m = r.cache.match(prompt);
  EXPECT_EQ(m.length, 4 * kBs);
  EXPECT_EQ(m.offloaded_pages, 4);
  r.cache.restore(&m, r.alloc());
  EXPECT_EQ(m.length, 4 * kBs);
  EXPECT_EQ(m.offloaded_pages, 0);
  ASSERT_EQ(m.pages.size(), 4u);
  std::vector<int32_t> ids;
  for (const IdPool::Handle& h : m.pages) ids.push_back(h.id());
  EXPECT_EQ(r.tier.restored_pages, ids) << "restored into the match's pages, in block order";
  r.expect_labels(m, prompt);
  EXPECT_EQ(r.tier.size(), 0);
  const PrefixCache::OffloadStats& st = r.cache.offload_stats();
  EXPECT_EQ(st.offloaded, 4);
  EXPECT_EQ(st.restored_pages, 4);
  EXPECT_EQ(st.hits, 1);
  EXPECT_EQ(st.lost, 0);
  m = {};
  PrefixCache::Match again = r.cache.match(prompt);
  EXPECT_EQ(again.length, 4 * kBs);
  EXPECT_EQ(again.offloaded_pages, 0) << "on the device again";
  again = {};
  r.cache.clear();
  EXPECT_EQ(r.pages.free_count(), 64);
}

TEST(PrefixOffload, HybridCheckpointComesBackWithItsPages) {
  std::mt19937 rng(2);
  Rig r(/*checkpoints=*/true);
  const auto prompt = random_tokens(rng, 3 * kBs + 1);
  r.insert(prompt, /*ckpt_block=*/3);
  ASSERT_TRUE(r.cache.evict_for_slot());
  EXPECT_FALSE(r.cache.has_evictable_checkpoint());
  EXPECT_EQ(r.slots.free_count(), 8);
  PrefixCache::Match m = r.cache.match(prompt);
  EXPECT_EQ(m.length, 3 * kBs) << "a checkpoint in the tier still serves the match";
  EXPECT_TRUE(m.offloaded_checkpoint);
  EXPECT_EQ(m.offloaded_pages, 0);
  m = {};
  while (r.cache.evict_for_page()) {
  }
  m = r.cache.match(prompt);
  EXPECT_EQ(m.offloaded_pages, 3);
  r.cache.restore(&m, r.alloc());
  EXPECT_EQ(m.length, 3 * kBs);
  ASSERT_TRUE(m.checkpoint.valid());
  r.expect_labels(m, prompt);
  EXPECT_EQ(r.cache.offload_stats().restored_pages, 3);
  EXPECT_EQ(r.cache.offload_stats().restored_checkpoints, 1);
  EXPECT_EQ(r.slots.free_count(), 7);
  m = {};
  r.cache.clear();
  EXPECT_EQ(r.pages.free_count(), 64);
  EXPECT_EQ(r.slots.free_count(), 8);
}

TEST(PrefixOffload, BlobsTheTierDropsAreForgotten) {
  std::mt19937 rng(3);
  Rig r(/*checkpoints=*/false, /*capacity=*/2);
  const auto prompt = random_tokens(rng, 4 * kBs + 1);
  r.insert(prompt);
  while (r.cache.evict_for_page()) {
  }
  // Blocks 3 and 2 went first, so the tier dropped them to take 1 and 0.
  EXPECT_EQ(r.tier.size(), 2);
  PrefixCache::Match m = r.cache.match(prompt);
  EXPECT_EQ(m.length, 2 * kBs);
  EXPECT_EQ(r.cache.num_entries(), 2) << "the dropped blocks' entries are pruned";
  EXPECT_EQ(r.cache.offload_stats().lost, 2);
  r.cache.restore(&m, r.alloc());
  EXPECT_EQ(m.length, 2 * kBs);
  r.expect_labels(m, prompt);
}

TEST(PrefixOffload, LostBlobCutsTheMatchAndAnInsertRefillsTheHole) {
  std::mt19937 rng(4);
  Rig r(/*checkpoints=*/false);
  const auto prompt = random_tokens(rng, 3 * kBs + 1);
  r.insert(prompt);
  while (r.cache.evict_for_page()) {
  }
  r.tier.lose_block = 1;
  PrefixCache::Match m = r.cache.match(prompt);
  ASSERT_EQ(m.length, 3 * kBs);
  r.cache.restore(&m, r.alloc());
  EXPECT_EQ(m.length, kBs) << "block 0 came back, block 1 was lost";
  ASSERT_EQ(m.pages.size(), 1u);
  r.expect_labels(m, prompt);
  EXPECT_EQ(r.cache.offload_stats().lost, 1);
  EXPECT_EQ(r.pages.free_count(), 63) << "the page block 1 was lost into is free again";
  EXPECT_EQ(r.tier.size(), 1) << "block 2 stays offloaded (released)";
  m = {};
  EXPECT_EQ(r.cache.match(prompt).length, kBs) << "the chain ends at the hole";
  // The recompute inserts its pages: the hole is filled, block 2's blob is not needed any more.
  r.tier.lose_block = -1;
  r.insert(prompt);
  EXPECT_EQ(r.tier.size(), 0);
  m = r.cache.match(prompt);
  EXPECT_EQ(m.length, 3 * kBs);
  EXPECT_EQ(m.offloaded_pages, 0);
  r.expect_labels(m, prompt);
}

TEST(PrefixOffload, NoIdsCutsToWhatIsOnTheDeviceAndKeepsTheBlobs) {
  std::mt19937 rng(5);
  Rig r(/*checkpoints=*/false);
  const auto prompt = random_tokens(rng, 3 * kBs + 1);
  r.insert(prompt);
  ASSERT_TRUE(r.cache.evict_for_page());  // block 2 only
  PrefixCache::Match m = r.cache.match(prompt);
  ASSERT_EQ(m.offloaded_pages, 1);
  r.cache.restore(&m, {.page = [] { return IdPool::Handle(); }, .slot = nullptr});
  EXPECT_EQ(m.length, 2 * kBs);
  EXPECT_EQ(r.tier.size(), 1);
  m = {};
  m = r.cache.match(prompt);
  r.cache.restore(&m, r.alloc());
  EXPECT_EQ(m.length, 3 * kBs);
  r.expect_labels(m, prompt);
}

// The collision test of scheduler_prefix_cache_test.cc with the tier: weak hashes, pages evicted
// to a tier that drops the oldest, restored into new ids; every page a match returns holds the
// prompt's prefix.
TEST(PrefixOffload, CollisionsNeverReturnAnotherPrefixsData) {
  const uint32_t seed = scheduler_testing::test_seed();
  SCOPED_TRACE(scheduler_testing::seed_note(seed));
  std::mt19937 rng(seed);
  const BlockHashFn weak[] = {[](const BlockHash&, std::span<const int32_t>) {
                                return BlockHash{1, 2};
                              },
                              [](const BlockHash& p, std::span<const int32_t> t) {
                                return BlockHash{p.lo + (t[0] & 3), 0};
                              },
                              [](const BlockHash&, std::span<const int32_t> t) {
                                return BlockHash{static_cast<uint64_t>(t[0] & 1), 0};
                              },
                              nullptr};
  for (BlockHashFn fn : weak) {
    for (bool checkpoints : {false, true}) {
      Rig r(checkpoints, /*capacity=*/6, fn);
      const std::vector<std::vector<int32_t>> bases = {random_tokens(rng, 4 * kBs),
                                                       random_tokens(rng, 4 * kBs)};
      int64_t restored = 0;
      for (int it = 0; it < 300; ++it) {
        auto prompt = bases[rng() % 2];
        prompt.resize(kBs * (1 + rng() % 4));
        if (rng() % 2) prompt[rng() % prompt.size()] = static_cast<int32_t>(rng() % 4);
        prompt.push_back(7);
        PrefixCache::Match m = r.cache.match(prompt);
        r.cache.restore(&m, r.alloc());
        ASSERT_EQ(m.length % kBs, 0);
        ASSERT_LT(m.length, static_cast<int32_t>(prompt.size()));
        ASSERT_EQ(m.pages.size(), static_cast<size_t>(m.length / kBs));
        for (size_t b = 0; b < m.pages.size(); ++b) {
          ASSERT_TRUE(m.pages[b].valid());
          ASSERT_EQ(r.page_labels.at(m.pages[b].id()), prefix(prompt, static_cast<int32_t>(b) + 1))
              << "page " << m.pages[b].id() << " holds another prefix";
        }
        if (checkpoints && m.length > 0) {
          ASSERT_TRUE(m.checkpoint.valid());
          ASSERT_EQ(r.slot_labels.at(m.checkpoint.id()), prefix(prompt, m.length / kBs));
        }
        m = {};
        while (r.pages.free_count() < 8 && r.cache.evict_for_page()) {
        }
        while (r.slots.free_count() < 2 && r.cache.evict_for_slot()) {
        }
        if (rng() % 3 == 0) {  // some pressure, so the tier fills and drops
          while (r.cache.evict_for_page()) {
          }
        }
        r.insert(prompt, checkpoints ? static_cast<int32_t>(prompt.size()) / kBs : 0);
      }
      restored = r.cache.offload_stats().restored_pages;
      if (fn == nullptr) {
        EXPECT_GT(restored, 0);  // weak hashes may keep too few entries to restore any
      }
      r.cache.clear();
      EXPECT_EQ(r.pages.free_count(), 64) << "no page leaks";
      EXPECT_EQ(r.slots.free_count(), 8) << "no slot leaks";
      EXPECT_EQ(r.tier.size(), 0);
    }
  }
}

}  // namespace
}  // namespace loom
