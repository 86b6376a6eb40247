// The scheduler's side of session offload (scheduler/sequence_offload.h), against a recording
// tier: a parked sequence over the parking budget is offloaded with the ids it held, which are
// then free; the session's next turn holds it, gets as many fresh pages and a slot, has it
// restored into exactly those, and resumes at its length; lost bytes admit the turn from 0; a
// turn whose pages cannot be had releases the hold and waits; dropping a session drops it there.
#include <algorithm>
#include <map>
#include <optional>
#include <span>
#include <vector>

#include "gtest/gtest.h"
#include "scheduler/scheduler.h"

namespace loom {
namespace {

class RecordingTier final : public SequenceOffload {
 public:
  struct Kept {
    std::vector<int32_t> pages;
    int32_t slot = -1;
    int32_t num_computed = 0;
  };
  bool offload(uint64_t key, std::span<const int32_t> pages, int32_t slot,
               int32_t num_computed) override {
    kept[key] = {std::vector<int32_t>(pages.begin(), pages.end()), slot, num_computed};
    return true;
  }
  std::optional<Held> hold(uint64_t key) override {
    auto it = kept.find(key);
    if (it == kept.end()) return std::nullopt;
    ++holds;
    return Held{it->second.num_computed, static_cast<int32_t>(it->second.pages.size()),
                it->second.slot >= 0};
  }
  void release(uint64_t) override { ++releases; }
  bool restore(uint64_t key, std::span<const int32_t> pages, int32_t slot) override {
    restored_pages.assign(pages.begin(), pages.end());
    restored_slot = slot;
    kept.erase(key);
    return !lose;
  }
  void drop(uint64_t key) override { kept.erase(key); }
  void clear() override { kept.clear(); }

  std::map<uint64_t, Kept> kept;
  std::vector<int32_t> restored_pages;
  int32_t restored_slot = -1;
  int holds = 0, releases = 0;
  bool lose = false;
};

SchedulerConfig config(RecordingTier* tier, int32_t pages) {
  SchedulerConfig c;
  c.num_pages = pages + 1;
  c.num_state_slots = 4;
  c.max_num_batched_tokens = 512;
  c.max_num_seqs = 4;
  c.enable_prefix_cache = false;
  c.parking.page_bytes = 10;
  c.parking.slot_bytes = 10;
  c.parking.max_bytes = 1;  // every parked sequence goes to the tier at once
  c.offload = tier;
  return c;
}

// Runs request `id` to its end (one sampled token per step); returns its first plan entry, with
// its page table copied into `pages` (the plan's view ends with the step).
SeqPlan run_turn(Scheduler& s, uint64_t id, std::vector<int32_t> prompt, uint64_t key,
                 std::vector<int32_t>* pages = nullptr) {
  EXPECT_TRUE(
      s.add({.id = id, .prompt = std::move(prompt), .max_new_tokens = 2, .park_key = key}).ok());
  std::optional<SeqPlan> first;
  for (int step = 0; step < 20 && s.has_unfinished(); ++step) {
    BatchPlan plan = s.schedule();
    StepResult r;
    for (const SeqPlan& p : plan.seqs) {
      if (!first) {
        first = p;
        if (pages != nullptr) pages->assign(p.page_table.begin(), p.page_table.end());
      }
      r.seqs.push_back({p.request_id, p.sample ? std::optional<int32_t>(5) : std::nullopt, false});
    }
    EXPECT_TRUE(s.complete(r).ok());
  }
  EXPECT_TRUE(first.has_value());
  return first.value_or(SeqPlan{});
}

std::vector<int32_t> tokens(int n) { return std::vector<int32_t>(n, 7); }

TEST(SchedulerOffload, OffloadsHeldIdsAndRestoresIntoFreshOnes) {
  RecordingTier tier;
  auto s = *Scheduler::create(config(&tier, 10));
  run_turn(*s, 1, tokens(150), 9);  // 150 + 1 computed: 3 pages
  ASSERT_TRUE(tier.kept.contains(9));
  EXPECT_EQ(tier.kept[9].num_computed, 151);
  EXPECT_EQ(tier.kept[9].pages.size(), 3u);
  EXPECT_EQ(s->parked().offloads(), 1);
  EXPECT_EQ(s->parked().count(), 0);
  EXPECT_EQ(s->kv_pool().free_count(), 10) << "the offloaded ids are free";
  EXPECT_EQ(s->slot_pool().free_count(), 3);
  std::vector<int32_t> table;
  const SeqPlan next = run_turn(*s, 2, tokens(152 + 40), 9, &table);
  EXPECT_EQ(tier.holds, 1);
  EXPECT_EQ(tier.restored_pages.size(), 3u);
  EXPECT_GE(tier.restored_slot, 1);
  EXPECT_EQ(next.start_pos, 151) << "resumes at the offloaded length";
  EXPECT_EQ(next.state_slot, tier.restored_slot);
  EXPECT_EQ(tier.restored_pages, table) << "restored into the pages the turn runs on";
  EXPECT_FALSE(next.fresh_state);
}

TEST(SchedulerOffload, LostBytesRecomputeAndShortPoolWaits) {
  RecordingTier tier;
  auto s = *Scheduler::create(config(&tier, 10));
  run_turn(*s, 1, tokens(150), 9);
  tier.lose = true;
  const SeqPlan lost = run_turn(*s, 2, tokens(152 + 10), 9);
  EXPECT_EQ(lost.start_pos, 0);
  EXPECT_TRUE(lost.fresh_state);
  // 162 + 1 computed (3 pages) offloaded again. A running request takes 8, then 9 of the 10
  // pages: the turn waits (each try releases its hold; the sequence stays offloaded) and resumes
  // once they are free.
  tier.lose = false;
  ASSERT_TRUE(s->add({.id = 3, .prompt = tokens(8 * 64 - 1), .max_new_tokens = 3}).ok());
  BatchPlan p = s->schedule();
  ASSERT_EQ(p.seqs.size(), 1u);
  ASSERT_TRUE(
      s->add({.id = 4, .prompt = tokens(164 + 5), .max_new_tokens = 1, .park_key = 9}).ok());
  ASSERT_TRUE(s->complete({{{3, 5, false}}}).ok());
  for (int step = 0; step < 2; ++step) {
    p = s->schedule();
    ASSERT_EQ(p.seqs.size(), 1u);
    EXPECT_EQ(p.seqs[0].request_id, 3u);
    ASSERT_TRUE(s->complete({{{3, 5, false}}}).ok());
  }
  EXPECT_EQ(tier.releases, 2);
  EXPECT_TRUE(tier.kept.contains(9));
  p = s->schedule();
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].request_id, 4u);
  EXPECT_EQ(p.seqs[0].start_pos, 163);
  ASSERT_TRUE(s->complete({{{4, 5, false}}}).ok());
  // Dropping the session drops what the tier keeps.
  ASSERT_TRUE(tier.kept.contains(9));
  s->drop_parked(9);
  EXPECT_FALSE(tier.kept.contains(9));
}

}  // namespace
}  // namespace loom
