// Randomized scheduler run: 10,000 steps of random arrivals (prompt lengths 1..700, shared
// prefixes), priorities, cancellations (also of in-flight requests) and engine-side stops on a
// small page and slot budget. After every schedule() and complete() every pool reference is
// reconciled against its owners (requests, prefix-cache entries) and the plan is checked against
// the limits; when arrivals stop every request ends finished or cancelled, and every output equals
// the oracle. The offload variants move the prefix cache's evicted pages and checkpoints to a
// small tier over the fake model's memory (prefix_cache.h) that drops the oldest and loses some on
// the way back: restored blocks must give the oracle's tokens, and lost ones recompute.
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "scheduler/scheduler.h"
#include "scheduler/scheduler_testing.h"

namespace loom {
namespace {

using scheduler_testing::Driver;

struct Case {
  bool attention, linear;
  int steps;
  int32_t budget;
  bool expect_preemption;       // memory, not the token budget, is the binding limit
  int32_t num_state_slots = 7;  // 6 usable: live requests and checkpoints compete
  int32_t offload_blobs = 0;    // > 0: a prefix offload tier of that many blobs
  int lose_percent = 0;         // of its restores
};

void run_random(const Case& cs) {
  const uint32_t seed = scheduler_testing::test_seed();
  SCOPED_TRACE(scheduler_testing::seed_note(seed));
  std::mt19937 rng(seed);
  SchedulerConfig c;
  c.has_attention_layers = cs.attention;
  c.has_linear_layers = cs.linear;
  c.num_pages = 41;  // the scratch page + 40: 2560 positions; one request needs up to 12 pages
  c.num_state_slots = cs.num_state_slots;
  c.max_num_batched_tokens = cs.budget;
  c.max_num_seqs = 8;
  c.checkpoint_interval = 1 + rng() % 3;
  scheduler_testing::FakeOffload tier(cs.offload_blobs, rng(), cs.lose_percent);
  if (cs.offload_blobs > 0) c.prefix_offload = &tier;
  Driver d(c, rng());
  tier.attach(&d.engine());
  std::vector<std::vector<int32_t>> systems;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> t(64 * (1 + rng() % 6));
    for (auto& x : t) x = static_cast<int32_t>(rng() % 997);
    systems.push_back(t);
  }
  std::vector<uint64_t> ids;
  uint64_t next = 1;
  auto random_live = [&]() -> uint64_t { return ids.empty() ? 0 : ids[rng() % ids.size()]; };
  int preempted = 0, hits = 0;
  for (int step = 0; step < cs.steps; ++step) {
    if (rng() % 100 < 35) {
      const int len = 1 + rng() % 700;
      std::vector<int32_t> prompt;
      if (rng() % 2) {
        const auto& sys = systems[rng() % systems.size()];
        prompt.assign(sys.begin(), sys.begin() + std::min<size_t>(sys.size(), len));
      }
      while (static_cast<int>(prompt.size()) < len) prompt.push_back(rng() % 997);
      ASSERT_TRUE(d.add(next, prompt, 1 + rng() % 40, rng() % 3).ok());
      ids.push_back(next++);
    }
    if (rng() % 100 < 3) {
      if (uint64_t id = random_live()) d.cancel(id).IgnoreError();  // may be finished already
    }
    auto stop = [&](uint64_t, int32_t) { return rng() % 100 < 3; };
    auto between = [&](const BatchPlan& p) {
      if (!p.seqs.empty() && rng() % 100 < 3) {
        ASSERT_TRUE(d.cancel(p.seqs[rng() % p.seqs.size()].request_id).ok());
      }
    };
    const std::string err = d.step(stop, between);
    ASSERT_EQ(err, "") << "step " << step;
    preempted += static_cast<int>(d.plan().preempted.size());
    for (const SeqPlan& q : d.plan().seqs) {
      if (q.prefix_hit_tokens > 0) {
        ++hits;
        ASSERT_EQ(q.prefix_hit_tokens, q.start_pos);
        ASSERT_EQ(q.restore_from_slot >= 0, cs.linear);
      }
    }
  }
  int drain_steps = 0;
  while (d.sched().has_unfinished()) {
    ASSERT_EQ(d.step(), "") << "drain step " << drain_steps;
    ASSERT_LT(++drain_steps, 200000);
  }
  for (uint64_t id = 1; id < next; ++id) {
    ASSERT_TRUE(d.finished().contains(id) || d.cancelled().contains(id)) << "request " << id;
  }
  EXPECT_EQ(d.check_outputs(), "");
  EXPECT_EQ(d.sched().num_running() + d.sched().num_waiting(), 0);
  if (cs.expect_preemption) {
    EXPECT_GT(preempted, 0);
  }
  EXPECT_GT(hits, 0);
  if (cs.offload_blobs > 0) {
    const PrefixCache::OffloadStats& os = d.sched().prefix_cache()->offload_stats();
    EXPECT_GT(os.restored_pages + os.restored_checkpoints, 0) << "blocks must come back";
    EXPECT_EQ(os.restored_pages + os.restored_checkpoints, tier.restores);
    if (cs.lose_percent > 0) EXPECT_GT(tier.losses, 0);
    std::printf(
        "offload: %lld stored, %lld restored, %lld lost on restore, %lld dropped, %d kept\n",
        static_cast<long long>(tier.stored), static_cast<long long>(tier.restores),
        static_cast<long long>(tier.losses), static_cast<long long>(tier.evictions), tier.size());
    // Nothing leaks: once the cache is dropped every id is free and the tier is empty.
    ASSERT_TRUE(d.sched().invalidate_caches().ok());
    EXPECT_EQ(d.sched().kv_pool().free_count(), d.sched().kv_pool().capacity());
    EXPECT_EQ(d.sched().slot_pool().free_count(), d.sched().slot_pool().capacity());
    EXPECT_EQ(tier.size(), 0);
  }
  std::printf(
      "steps %d + %d drain, %d requests, %d preemptions, %d prefix hits, %d finished, "
      "%d cancelled\n",
      cs.steps, drain_steps, static_cast<int>(next - 1), preempted, hits,
      static_cast<int>(d.finished().size()), static_cast<int>(d.cancelled().size()));
}

TEST(SchedulerRandom, Hybrid10kSteps) { run_random({true, true, 10000, 256, true}); }
TEST(SchedulerRandom, AttentionOnly) { run_random({true, false, 3000, 512, true}); }
TEST(SchedulerRandom, LinearOnly) { run_random({false, true, 3000, 512, false, 16}); }
TEST(SchedulerRandom, HybridTinyBudget) { run_random({true, true, 3000, 16, false}); }
TEST(SchedulerRandom, HybridPrefixOffload) {
  run_random({true, true, 5000, 256, true, 7, /*offload_blobs=*/60, /*lose_percent=*/5});
}
TEST(SchedulerRandom, AttentionOnlyPrefixOffload) {
  run_random({true, false, 3000, 512, true, 7, /*offload_blobs=*/40, /*lose_percent=*/5});
}
TEST(SchedulerRandom, LinearOnlyPrefixOffload) {
  run_random({false, true, 3000, 512, false, 16, /*offload_blobs=*/20, /*lose_percent=*/5});
}

}  // namespace
}  // namespace loom
