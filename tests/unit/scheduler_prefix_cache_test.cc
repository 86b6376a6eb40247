// PrefixCache: hits, misses, hybrid checkpoint rule, LRU eviction order, collision safety.
#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "gtest/gtest.h"
#include "scheduler/id_pool.h"
#include "scheduler/prefix_cache.h"
#include "scheduler/scheduler_testing.h"

namespace loom {
namespace {

constexpr int32_t kBs = 64;

std::vector<int32_t> random_tokens(std::mt19937& rng, int n) {
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % 50000);
  return t;
}

// Inserts the full blocks of `tokens` with freshly allocated pages (and, if `ckpt_block` > 0, a
// checkpoint after that many blocks); returns the page ids (the cache keeps the only references).
std::vector<int32_t> insert_prompt(PrefixCache& cache, KvPagePool* pages, StateSlotPool* slots,
                                   const std::vector<int32_t>& tokens, int32_t ckpt_block) {
  std::vector<BlockHash> hashes;
  cache.hash_blocks(tokens, &hashes);
  const int32_t blocks = static_cast<int32_t>(tokens.size()) / kBs;
  std::vector<IdPool::Handle> held;
  if (pages) {
    EXPECT_TRUE(pages->allocate(blocks, &held));
  }
  std::vector<int32_t> ids;
  for (auto& h : held) ids.push_back(h.id());
  if (ckpt_block > 0) {
    cache.insert(tokens, hashes, ckpt_block, held, slots->allocate_one());
  }
  cache.insert(tokens, hashes, blocks, held, IdPool::Handle());
  return ids;
}

TEST(SchedulerPrefixCache, AttentionOnlyHitMiss) {
  const uint32_t seed = scheduler_testing::test_seed();
  SCOPED_TRACE(scheduler_testing::seed_note(seed));
  std::mt19937 rng(seed);
  KvPagePool pages(65, kBs);  // 64 beside the scratch page
  PrefixCache cache({.block_size = kBs, .has_pages = true, .has_checkpoints = false});
  const auto prompt = random_tokens(rng, 5 * kBs + 17);
  EXPECT_EQ(cache.match(prompt).length, 0);  // empty cache
  const auto ids = insert_prompt(cache, &pages, nullptr, prompt, 0);
  EXPECT_EQ(cache.num_entries(), 5);
  EXPECT_EQ(pages.free_count(), 64 - 5);
  {
    auto m = cache.match(prompt);
    EXPECT_EQ(m.length, 5 * kBs);
    ASSERT_EQ(m.pages.size(), 5u);
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(m.pages[i].id(), ids[i]);
      EXPECT_EQ(pages.ref_count(ids[i]), 2);  // cache + this match
    }
    EXPECT_FALSE(m.checkpoint.valid());
  }
  EXPECT_EQ(pages.ref_count(ids[0]), 1);
  // A prompt of exactly 5 blocks must leave one token to compute: 4 blocks.
  std::vector<int32_t> exact(prompt.begin(), prompt.begin() + 5 * kBs);
  EXPECT_EQ(cache.match(exact).length, 4 * kBs);
  // Divergence inside block 2 keeps blocks 0-1.
  auto diverged = prompt;
  diverged[2 * kBs + 5] ^= 1;
  EXPECT_EQ(cache.match(diverged).length, 2 * kBs);
  // Same block content after a different parent is a different entry.
  std::vector<int32_t> shifted(prompt.begin() + kBs, prompt.end());
  EXPECT_EQ(cache.match(shifted).length, 0);
  EXPECT_EQ(cache.match(std::vector<int32_t>(prompt.begin(), prompt.begin() + kBs)).length, 0);
}

TEST(SchedulerPrefixCache, HybridNeedsCheckpointAtExactLength) {
  const uint32_t seed = scheduler_testing::test_seed();
  SCOPED_TRACE(scheduler_testing::seed_note(seed));
  std::mt19937 rng(seed);
  KvPagePool pages(65, kBs);  // 64 beside the scratch page
  StateSlotPool slots(8);
  PrefixCache cache({.block_size = kBs, .has_pages = true, .has_checkpoints = true});
  const auto prompt = random_tokens(rng, 6 * kBs + 3);
  const auto ids = insert_prompt(cache, &pages, &slots, prompt, 2);  // checkpoint after block 2
  EXPECT_EQ(cache.num_entries(), 6);
  auto m = cache.match(prompt);
  EXPECT_EQ(m.length, 2 * kBs);  // pages exist up to 6 blocks, the state only at 2
  ASSERT_EQ(m.pages.size(), 2u);
  EXPECT_EQ(m.pages[1].id(), ids[1]);
  ASSERT_TRUE(m.checkpoint.valid());
  EXPECT_GE(m.checkpoint.id(), 1);
  EXPECT_EQ(m.checkpoint.use_count(), 2);
  // Inserting another checkpoint at the same block keeps the first one.
  std::vector<BlockHash> hashes;
  cache.hash_blocks(prompt, &hashes);
  std::vector<IdPool::Handle> held;
  for (const auto& p : m.pages) held.push_back(p.share());
  IdPool::Handle dup = slots.allocate_one();
  const int32_t dup_id = dup.id();
  cache.insert(prompt, hashes, 2, held, std::move(dup));
  EXPECT_EQ(slots.ref_count(dup_id), 0);  // dropped, back in the pool
  EXPECT_EQ(cache.match(prompt).checkpoint.id(), m.checkpoint.id());
}

TEST(SchedulerPrefixCache, LinearOnlyHoldsNoPages) {
  const uint32_t seed = scheduler_testing::test_seed();
  SCOPED_TRACE(scheduler_testing::seed_note(seed));
  std::mt19937 rng(seed);
  StateSlotPool slots(4);
  PrefixCache cache({.block_size = kBs, .has_pages = false, .has_checkpoints = true});
  const auto prompt = random_tokens(rng, 3 * kBs + 1);
  std::vector<BlockHash> hashes;
  cache.hash_blocks(prompt, &hashes);
  cache.insert(prompt, hashes, 3, {}, slots.allocate_one());
  auto m = cache.match(prompt);
  EXPECT_EQ(m.length, 3 * kBs);
  EXPECT_TRUE(m.pages.empty());
  EXPECT_TRUE(m.checkpoint.valid());
  m = {};
  // Dropping the only checkpoint prunes the chain that led to it.
  EXPECT_TRUE(cache.evict_for_slot());
  EXPECT_EQ(cache.num_entries(), 0);
  EXPECT_EQ(slots.free_count(), 3);
  EXPECT_FALSE(cache.evict_for_slot());
  EXPECT_FALSE(cache.evict_for_page());
}

TEST(SchedulerPrefixCache, EvictsLeastRecentlyUsedLeafFirst) {
  const uint32_t seed = scheduler_testing::test_seed();
  SCOPED_TRACE(scheduler_testing::seed_note(seed));
  std::mt19937 rng(seed);
  KvPagePool pages(17, kBs);  // 16 beside the scratch page
  PrefixCache cache({.block_size = kBs, .has_pages = true, .has_checkpoints = false});
  const auto a = random_tokens(rng, kBs + 1), b = random_tokens(rng, kBs + 1),
             c = random_tokens(rng, 2 * kBs + 1);
  const int32_t pa = insert_prompt(cache, &pages, nullptr, a, 0)[0];
  const int32_t pb = insert_prompt(cache, &pages, nullptr, b, 0)[0];
  const auto pc = insert_prompt(cache, &pages, nullptr, c, 0);
  EXPECT_EQ(cache.match(a).length, kBs);  // touch a: order by last use is b, c, a
  auto live = [&] {
    std::set<int32_t> s;
    cache.for_each_entry([&](int32_t page, int32_t, int32_t) { s.insert(page); });
    return s;
  };
  ASSERT_TRUE(cache.evict_for_page());
  EXPECT_EQ(live(), (std::set<int32_t>{pa, pc[0], pc[1]}));
  EXPECT_EQ(pages.ref_count(pb), 0);
  ASSERT_TRUE(cache.evict_for_page());  // c's leaf (block 1) before its parent
  EXPECT_EQ(live(), (std::set<int32_t>{pa, pc[0]}));
  {
    auto in_use = cache.match(a);  // a is now in use: never evicted while shared
    ASSERT_TRUE(cache.evict_for_page());
    EXPECT_EQ(live(), (std::set<int32_t>{pa}));
    EXPECT_FALSE(cache.evict_for_page());
    EXPECT_EQ(pages.ref_count(pa), 2);
  }
  ASSERT_TRUE(cache.evict_for_page());
  EXPECT_EQ(cache.num_entries(), 0);
  EXPECT_EQ(pages.free_count(), 16);
}

TEST(SchedulerPrefixCache, CheckpointEvictionIsLruAndSkipsInUse) {
  const uint32_t seed = scheduler_testing::test_seed();
  SCOPED_TRACE(scheduler_testing::seed_note(seed));
  std::mt19937 rng(seed);
  KvPagePool pages(17, kBs);  // 16 beside the scratch page
  StateSlotPool slots(4);
  PrefixCache cache({.block_size = kBs, .has_pages = true, .has_checkpoints = true});
  const auto a = random_tokens(rng, 2 * kBs + 1), b = random_tokens(rng, 2 * kBs + 1),
             c = random_tokens(rng, kBs + 1);
  insert_prompt(cache, &pages, &slots, a, 1);
  insert_prompt(cache, &pages, &slots, b, 2);
  insert_prompt(cache, &pages, &slots, c, 1);
  EXPECT_EQ(slots.free_count(), 0);
  EXPECT_EQ(cache.match(a).length, kBs);  // touch a: checkpoint LRU order is b, c, a
  ASSERT_TRUE(cache.evict_for_slot());
  EXPECT_EQ(cache.match(b).length, 0);  // b's checkpoint went first; its pages stay
  EXPECT_EQ(cache.num_entries(), 5);
  auto hold_a = cache.match(a);  // a in use
  EXPECT_EQ(hold_a.length, kBs);
  EXPECT_EQ(cache.match(c).length, kBs);  // touch c: a is the oldest, but in use, so c's goes
  ASSERT_TRUE(cache.evict_for_slot());
  EXPECT_EQ(cache.match(c).length, 0);
  EXPECT_FALSE(cache.evict_for_slot());  // only a's remains and it is shared
  hold_a = {};
  EXPECT_TRUE(cache.evict_for_slot());
  EXPECT_EQ(slots.free_count(), 3);
  EXPECT_EQ(cache.num_entries(), 5);  // pages stay cached without checkpoints
}

// Any hash, even a constant one, never returns another prefix's data: hits compare tokens and
// the parent entry. Every match is checked against what the test recorded for each page.
TEST(SchedulerPrefixCache, CollisionsNeverReturnWrongData) {
  const uint32_t seed = scheduler_testing::test_seed();
  SCOPED_TRACE(scheduler_testing::seed_note(seed));
  std::mt19937 rng(seed);
  const BlockHashFn weak[] = {[](const BlockHash&, std::span<const int32_t>) {
                                return BlockHash{1, 2};
                              },
                              [](const BlockHash& p, std::span<const int32_t> t) {
                                return BlockHash{p.lo + (t[0] & 3), 0};
                              },
                              nullptr};
  for (BlockHashFn fn : weak) {
    KvPagePool pages(513, kBs);  // 512 beside the scratch page
    PrefixCache cache({.block_size = kBs, .has_pages = true, .has_checkpoints = false, .hash = fn});
    absl::flat_hash_map<int32_t, std::vector<int32_t>> page_prefix;  // page -> tokens [0, end)
    // Few distinct values so prompts share prefixes and weak hashes collide.
    const std::vector<std::vector<int32_t>> bases = {random_tokens(rng, 4 * kBs),
                                                     random_tokens(rng, 4 * kBs)};
    for (int it = 0; it < 200; ++it) {
      auto prompt = bases[rng() % 2];
      prompt.resize(kBs * (1 + rng() % 4));
      if (rng() % 2) prompt[rng() % prompt.size()] = static_cast<int32_t>(rng() % 4);
      prompt.push_back(7);
      auto m = cache.match(prompt);
      ASSERT_EQ(m.length % kBs, 0);
      ASSERT_LT(m.length, static_cast<int32_t>(prompt.size()));
      for (size_t i = 0; i < m.pages.size(); ++i) {
        const auto& want = page_prefix.at(m.pages[i].id());
        ASSERT_TRUE(std::equal(want.begin(), want.end(), prompt.begin()))
            << "page " << m.pages[i].id() << " holds another prefix";
        ASSERT_EQ(want.size(), (i + 1) * kBs);
      }
      m = {};
      if (pages.free_count() < 8) {
        while (cache.evict_for_page()) {
        }
      }
      std::vector<BlockHash> hashes;
      cache.hash_blocks(prompt, &hashes);
      std::vector<IdPool::Handle> held;
      const int32_t blocks = static_cast<int32_t>(prompt.size()) / kBs;
      ASSERT_TRUE(pages.allocate(blocks, &held));
      for (int32_t b = 0; b < blocks; ++b) {
        page_prefix[held[b].id()].assign(prompt.begin(), prompt.begin() + (b + 1) * kBs);
      }
      cache.insert(prompt, hashes, blocks, held, IdPool::Handle());
    }
    if (fn == weak[0]) {
      EXPECT_EQ(cache.num_entries(), 1);  // a constant hash keeps one entry
    }
    cache.clear();
    EXPECT_EQ(pages.free_count(), 512);
  }
}

TEST(SchedulerPrefixCache, DefaultHashIsChainedAndSpreads) {
  const uint32_t seed = scheduler_testing::test_seed();
  SCOPED_TRACE(scheduler_testing::seed_note(seed));
  std::mt19937 rng(seed);
  std::set<std::pair<uint64_t, uint64_t>> seen;
  for (int i = 0; i < 2000; ++i) {
    auto t = random_tokens(rng, kBs);
    const BlockHash h = block_hash_default(kRootBlockHash, t);
    seen.insert({h.lo, h.hi});
    t[rng() % kBs] += 1;  // one-token change
    const BlockHash h2 = block_hash_default(kRootBlockHash, t);
    ASSERT_NE(h, h2);
    ASSERT_NE(block_hash_default(h, t), h2);  // parent matters
  }
  EXPECT_EQ(seen.size(), 2000u);
}

}  // namespace
}  // namespace loom
