// KvPagePool / StateSlotPool reference counting and cache sizing arithmetic.
#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "scheduler/cache_sizing.h"
#include "scheduler/id_pool.h"
#include "scheduler/scheduler_testing.h"

namespace loom {
namespace {

TEST(SchedulerPool, AllocateIsAllOrNothing) {
  KvPagePool pool(9, 64);  // the scratch page and 8 more
  EXPECT_EQ(pool.capacity(), 8);
  std::vector<IdPool::Handle> a;
  ASSERT_TRUE(pool.allocate(5, &a));
  EXPECT_EQ(a.size(), 5u);
  EXPECT_EQ(pool.free_count(), 3);
  std::vector<IdPool::Handle> b;
  b.push_back(pool.allocate_one());
  EXPECT_FALSE(pool.allocate(3, &b));  // only 2 free: nothing taken, b untouched
  EXPECT_EQ(b.size(), 1u);
  EXPECT_EQ(pool.free_count(), 2);
  EXPECT_TRUE(pool.allocate(0, &b));
  EXPECT_TRUE(pool.allocate(2, &b));
  EXPECT_EQ(pool.free_count(), 0);
  EXPECT_FALSE(pool.allocate_one().valid());
  std::set<int32_t> ids;
  for (auto& h : a) ids.insert(h.id());
  for (auto& h : b) ids.insert(h.id());
  EXPECT_EQ(ids.size(), 8u);
  EXPECT_EQ(*ids.begin(), 1);
  EXPECT_EQ(*ids.rbegin(), 8);
  a.clear();
  b.clear();
  EXPECT_EQ(pool.free_count(), 8);
  EXPECT_EQ(pool.pages_for_tokens(0), 0);
  EXPECT_EQ(pool.pages_for_tokens(1), 1);
  EXPECT_EQ(pool.pages_for_tokens(64), 1);
  EXPECT_EQ(pool.pages_for_tokens(65), 2);
}

TEST(SchedulerPool, SharedReferencesFreeOnLastRelease) {
  KvPagePool pool(3, 64);  // 2 pages beside the scratch page
  IdPool::Handle h = pool.allocate_one();
  const int32_t id = h.id();
  IdPool::Handle s1 = h.share();
  IdPool::Handle s2 = s1.share();
  EXPECT_EQ(pool.ref_count(id), 3);
  EXPECT_EQ(h.use_count(), 3);
  h.reset();
  EXPECT_FALSE(h.valid());
  EXPECT_EQ(h.id(), -1);
  h.reset();  // resetting an empty handle is a no-op
  EXPECT_EQ(pool.ref_count(id), 2);
  EXPECT_EQ(pool.free_count(), 1);
  IdPool::Handle moved = std::move(s1);
  EXPECT_FALSE(s1.valid());  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
  EXPECT_EQ(pool.ref_count(id), 2);
  IdPool::Handle other = pool.allocate_one();
  const int32_t other_id = other.id();
  other = std::move(moved);  // move-assign releases the old id
  EXPECT_EQ(pool.ref_count(other_id), 0);
  EXPECT_EQ(pool.ref_count(id), 2);
  EXPECT_EQ(pool.free_count(), 1);
  other.reset();
  s2.reset();
  EXPECT_EQ(pool.ref_count(id), 0);
  EXPECT_EQ(pool.free_count(), 2);
  EXPECT_FALSE(IdPool::Handle().share().valid());
}

TEST(SchedulerPool, SlotZeroIsNeverHandedOut) {
  StateSlotPool pool(5);
  EXPECT_EQ(pool.capacity(), 4);
  EXPECT_EQ(pool.first_id(), 1);
  const uint32_t seed = scheduler_testing::test_seed();
  SCOPED_TRACE(scheduler_testing::seed_note(seed));
  std::mt19937 rng(seed);
  std::vector<IdPool::Handle> live;
  for (int i = 0; i < 2000; ++i) {
    if (rng() % 2 && !live.empty()) {
      live.erase(live.begin() + rng() % live.size());
    } else {
      IdPool::Handle h = pool.allocate_one();
      if (static_cast<int32_t>(live.size()) == pool.capacity()) {
        ASSERT_FALSE(h.valid());
        continue;
      }
      ASSERT_TRUE(h.valid());
      ASSERT_NE(h.id(), StateSlotPool::kScratchSlot);
      ASSERT_GE(h.id(), 1);
      ASSERT_LT(h.id(), 5);
      live.push_back(std::move(h));
    }
    std::set<int32_t> ids;
    for (auto& h : live) ids.insert(h.id());
    ASSERT_EQ(ids.size(), live.size());  // never handed out twice
    ASSERT_EQ(pool.free_count() + static_cast<int32_t>(live.size()), pool.capacity());
  }
  EXPECT_EQ(StateSlotPool(1).capacity(), 0);
  EXPECT_EQ(StateSlotPool(0).capacity(), 0);
}

// Page 0 is the scratch page padded page-table entries point at: no allocation returns it.
TEST(SchedulerPool, PageZeroIsNeverHandedOut) {
  KvPagePool pool(6, 64);
  EXPECT_EQ(pool.capacity(), 5);
  EXPECT_EQ(pool.first_id(), 1);
  EXPECT_EQ(pool.end_id(), 6);
  const uint32_t seed = scheduler_testing::test_seed();
  SCOPED_TRACE(scheduler_testing::seed_note(seed));
  std::mt19937 rng(seed);
  std::vector<IdPool::Handle> live;
  for (int i = 0; i < 2000; ++i) {
    if (rng() % 2 && !live.empty()) {
      live.erase(live.begin() + rng() % live.size());
    } else {
      const int32_t n = static_cast<int32_t>(rng() % 3);
      const bool fits = static_cast<int32_t>(live.size()) + n <= pool.capacity();
      ASSERT_EQ(pool.allocate(n, &live), fits);
    }
    std::set<int32_t> ids;
    for (auto& h : live) {
      ASSERT_NE(h.id(), KvPagePool::kScratchPage);
      ASSERT_GE(h.id(), 1);
      ASSERT_LT(h.id(), 6);
      ids.insert(h.id());
    }
    ASSERT_EQ(ids.size(), live.size());
    ASSERT_EQ(pool.free_count() + static_cast<int32_t>(live.size()), pool.capacity());
  }
  EXPECT_EQ(KvPagePool(1, 64).capacity(), 0);
  EXPECT_EQ(KvPagePool(0, 64).capacity(), 0);
}

TEST(SchedulerPool, RandomRefcountsReconcile) {
  const uint32_t seed = scheduler_testing::test_seed();
  SCOPED_TRACE(scheduler_testing::seed_note(seed));
  std::mt19937 rng(seed);
  KvPagePool pool(17, 64);  // ids 1..16
  std::vector<IdPool::Handle> holders;
  for (int i = 0; i < 5000; ++i) {
    const int op = rng() % 3;
    if (op == 0) {
      pool.allocate(rng() % 4, &holders);
    } else if (op == 1 && !holders.empty()) {
      holders.push_back(holders[rng() % holders.size()].share());
    } else if (!holders.empty()) {
      holders.erase(holders.begin() + rng() % holders.size());
    }
    std::vector<int32_t> refs(17, 0);
    for (auto& h : holders) ++refs[h.id()];
    int32_t used = 0;
    for (int32_t id = 1; id <= 16; ++id) {
      ASSERT_EQ(pool.ref_count(id), refs[id]);
      used += refs[id] > 0;
    }
    ASSERT_EQ(pool.free_count(), 16 - used);
  }
}

TEST(SchedulerPoolDeathTest, PoolDestroyedWithLiveHandleAborts) {
  EXPECT_DEATH(
      {
        auto* pool = new KvPagePool(2, 64);
        IdPool::Handle h = pool->allocate_one();
        delete pool;
        h = IdPool::Handle();
      },
      "still referenced");
}

TEST(SchedulerSizing, HybridRoundsPagesDown) {
  const std::vector<int64_t> kv = {576 * 2, 576 * 2, 576 * 2};  // 3 MLA layers, bf16 latent
  CacheSizingInput in;
  in.kv_bytes_per_token = kv;
  in.state_bytes_per_slot = 1 << 20;
  in.max_num_seqs = 8;
  in.num_checkpoint_slots = 4;
  in.page_size = 64;
  const int64_t page_bytes = 3 * 576 * 2 * 64;
  in.budget_bytes = 13 * (int64_t{1} << 20) + 100 * page_bytes + page_bytes - 1;
  auto s = cache_sizing_compute(in);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->num_state_slots, 13);  // 1 scratch + 8 live + 4 checkpoints
  EXPECT_EQ(s->page_bytes, page_bytes);
  EXPECT_EQ(s->num_pages, 100);  // the partial page is dropped; the scratch page counts
  EXPECT_EQ(s->used_bytes, 13 * (int64_t{1} << 20) + 100 * page_bytes);
  EXPECT_LE(s->used_bytes, in.budget_bytes);
}

TEST(SchedulerSizing, PureModelsAndErrors) {
  CacheSizingInput in;
  in.state_bytes_per_slot = 1000;
  in.max_num_seqs = 4;
  in.budget_bytes = 9000;
  auto lin = cache_sizing_compute(in);  // linear-only, default checkpoint slots = max_num_seqs
  ASSERT_TRUE(lin.ok());
  EXPECT_EQ(lin->num_pages, 0);
  EXPECT_EQ(lin->num_state_slots, 9);
  in.budget_bytes = 8999;
  EXPECT_EQ(cache_sizing_compute(in).status().code(), absl::StatusCode::kResourceExhausted);

  const std::vector<int64_t> kv = {60, 40};  // 100 bytes per token: 6400 per page
  CacheSizingInput at;
  at.kv_bytes_per_token = kv;
  at.budget_bytes = 6400 * 7 + 5;
  auto att = cache_sizing_compute(at);
  ASSERT_TRUE(att.ok());
  EXPECT_EQ(att->num_state_slots, 0);
  EXPECT_EQ(att->num_pages, 7);  // the scratch page 0 and 6 a request can hold
  EXPECT_EQ(att->used_bytes, 6400 * 7);
  at.budget_bytes = 6400 * 2;  // the scratch page and one more: the least that can serve
  att = cache_sizing_compute(at);
  ASSERT_TRUE(att.ok());
  EXPECT_EQ(att->num_pages, 2);
  at.budget_bytes = 6400 * 2 - 1;  // only the scratch page fits
  EXPECT_EQ(cache_sizing_compute(at).status().code(), absl::StatusCode::kResourceExhausted);
  at.budget_bytes = 6399;
  EXPECT_EQ(cache_sizing_compute(at).status().code(), absl::StatusCode::kResourceExhausted);
  at.budget_bytes = -1;
  EXPECT_EQ(cache_sizing_compute(at).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loom
