// Scheduler behaviour on a deterministic fake model (scheduler/scheduler_testing.h): decode-first
// ordering, token budgets, checkpoint chunk boundaries, preemption with recompute, prefix hits,
// cancellation and result validation.
#include "scheduler/scheduler.h"

#include <algorithm>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "scheduler/scheduler_testing.h"

namespace loom {
namespace {

using scheduler_testing::audit;
using scheduler_testing::Driver;

constexpr int32_t kPage = 64;

struct Kind {
  bool attention;
  bool linear;
  const char* name;
};
constexpr Kind kKinds[] = {
    {true, true, "hybrid"}, {true, false, "attention"}, {false, true, "linear"}};

// `pages`: pages requests can hold; the pool has one more, the scratch page 0 (as `slots`
// counts the scratch slot).
SchedulerConfig make_config(Kind k, int32_t pages, int32_t slots, int32_t budget, int32_t seqs) {
  SchedulerConfig c;
  c.has_attention_layers = k.attention;
  c.has_linear_layers = k.linear;
  c.num_pages = pages + 1;
  c.num_state_slots = slots;
  c.max_num_batched_tokens = budget;
  c.max_num_seqs = seqs;
  c.page_size = kPage;
  return c;
}

std::vector<int32_t> random_tokens(std::mt19937& rng, int n) {
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % 997);
  return t;
}

// Steps until nothing is left; returns the number of steps.
int drain(Driver& d, int max_steps = 100000) {
  int steps = 0;
  while (d.sched().has_unfinished() && steps < max_steps) {
    const std::string err = d.step();
    EXPECT_EQ(err, "") << "step " << steps;
    if (!err.empty()) break;
    ++steps;
  }
  EXPECT_FALSE(d.sched().has_unfinished());
  return steps;
}

TEST(Scheduler, RejectsBadConfigsAndRequests) {
  SchedulerConfig c = make_config(kKinds[0], 4, 3, 64, 4);
  c.num_state_slots = 1;  // only the scratch slot
  EXPECT_FALSE(Scheduler::create(c).ok());
  c = make_config(kKinds[0], 0, 3, 64, 4);  // only the scratch page
  EXPECT_EQ(c.num_pages, 1);
  EXPECT_FALSE(Scheduler::create(c).ok());
  c.num_pages = 2;  // the scratch page and one page a request can hold
  EXPECT_TRUE(Scheduler::create(c).ok());
  c.num_pages = 0;
  EXPECT_FALSE(Scheduler::create(c).ok());
  c = make_config(kKinds[0], 4, 3, 0, 4);
  EXPECT_FALSE(Scheduler::create(c).ok());
  auto s = Scheduler::create(make_config(kKinds[0], 4, 3, 64, 4));
  ASSERT_TRUE(s.ok());
  Scheduler& sched = **s;
  EXPECT_TRUE(sched.add({1, {1, 2, 3}, 5, 0}).ok());
  EXPECT_EQ(sched.add({1, {1}, 5, 0}).code(), absl::StatusCode::kInvalidArgument);  // duplicate
  EXPECT_EQ(sched.add({2, {}, 5, 0}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sched.add({2, {1}, 0, 0}).code(), absl::StatusCode::kInvalidArgument);
  // 4 pages hold 256 positions: 200 prompt + 57 outputs needs 256 positions (the last output is
  // never fed), 58 needs 257.
  EXPECT_TRUE(sched.add({3, std::vector<int32_t>(200, 1), 57, 0}).ok());
  EXPECT_EQ(sched.add({4, std::vector<int32_t>(200, 1), 58, 0}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sched.cancel(99).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(sched.cancel(1).ok());
  EXPECT_TRUE(sched.cancel(3).ok());
  EXPECT_EQ(sched.kv_pool().free_count(), 4);
}

TEST(Scheduler, CompleteValidatesResults) {
  auto s = Scheduler::create(make_config(kKinds[0], 8, 4, 64, 4));
  ASSERT_TRUE(s.ok());
  Scheduler& sched = **s;
  ASSERT_TRUE(sched.add({7, std::vector<int32_t>(10, 3), 4, 0}).ok());
  EXPECT_EQ(sched.complete({}).status().code(), absl::StatusCode::kFailedPrecondition);
  BatchPlan plan = sched.schedule();
  ASSERT_EQ(plan.seqs.size(), 1u);
  EXPECT_TRUE(plan.seqs[0].sample);
  EXPECT_EQ(sched.complete({}).status().code(), absl::StatusCode::kInvalidArgument);  // missing
  StepResult no_token{{SeqResult{7, std::nullopt, false}}};
  EXPECT_EQ(sched.complete(no_token).status().code(), absl::StatusCode::kInvalidArgument);
  StepResult stranger{{SeqResult{7, 5, false}, SeqResult{8, 5, false}}};
  EXPECT_EQ(sched.complete(stranger).status().code(), absl::StatusCode::kInvalidArgument);
  StepResult ok{{SeqResult{7, 5, false}}};
  auto done = sched.complete(ok);  // nothing changed by the rejected ones
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(done->empty());
  sched.for_each_request([](const RequestView& r) {
    EXPECT_EQ(r.num_computed, 10);
    EXPECT_EQ(r.tokens.size(), 11u);
  });
}

TEST(Scheduler, DecodesFirstThenPrefillFillsTheBudget) {
  const uint32_t seed = scheduler_testing::test_seed();
  SCOPED_TRACE(scheduler_testing::seed_note(seed));
  std::mt19937 rng(seed);
  SchedulerConfig c = make_config(kKinds[0], 64, 16, 100, 8);
  c.checkpoint_interval = 100;  // only the last-full-block checkpoint
  Driver d(c, rng());
  for (uint64_t id = 1; id <= 3; ++id) ASSERT_TRUE(d.add(id, random_tokens(rng, 50), 20).ok());
  ASSERT_EQ(d.step(), "");
  ASSERT_EQ(d.plan().seqs.size(), 2u);  // 50 + 50 fill the budget; 3 waits
  EXPECT_EQ(d.plan().num_batched_tokens, 100);
  ASSERT_EQ(d.step(), "");
  ASSERT_EQ(d.plan().seqs.size(), 3u);
  EXPECT_TRUE(d.plan().seqs[0].is_decode);
  EXPECT_TRUE(d.plan().seqs[1].is_decode);
  EXPECT_EQ(d.plan().seqs[2].request_id, 3u);
  EXPECT_EQ(d.plan().seqs[2].tokens.size(), 50u);
  ASSERT_TRUE(d.add(4, random_tokens(rng, 500), 5).ok());
  ASSERT_EQ(d.step(), "");
  ASSERT_EQ(d.plan().seqs.size(), 4u);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(d.plan().seqs[i].is_decode);
  EXPECT_EQ(d.plan().seqs[3].request_id, 4u);
  EXPECT_EQ(d.plan().seqs[3].tokens.size(), 97u);  // what the decodes left
  EXPECT_FALSE(d.plan().seqs[3].sample);
  EXPECT_TRUE(d.plan().seqs[3].fresh_state);
  ASSERT_EQ(d.step(), "");
  EXPECT_EQ(d.plan().seqs[3].start_pos, 97);  // the partial prefill continues
  EXPECT_FALSE(d.plan().seqs[3].fresh_state);
  drain(d);
  EXPECT_EQ(d.check_outputs(), "");
}

TEST(Scheduler, HigherPriorityAdmittedFirst) {
  const uint32_t seed = scheduler_testing::test_seed();
  SCOPED_TRACE(scheduler_testing::seed_note(seed));
  std::mt19937 rng(seed);
  Driver d(make_config(kKinds[0], 64, 16, 64, 1), rng());
  ASSERT_TRUE(d.add(1, random_tokens(rng, 10), 2, 0).ok());
  ASSERT_TRUE(d.add(2, random_tokens(rng, 10), 2, 5).ok());
  ASSERT_TRUE(d.add(3, random_tokens(rng, 10), 2, 5).ok());
  std::vector<uint64_t> first_seen;
  while (d.sched().has_unfinished()) {
    ASSERT_EQ(d.step(), "");
    for (const SeqPlan& q : d.plan().seqs) {
      if (q.start_pos == 0) first_seen.push_back(q.request_id);
    }
  }
  EXPECT_EQ(first_seen, (std::vector<uint64_t>{2, 3, 1}));
  EXPECT_EQ(d.check_outputs(), "");
}

class SchedulerBudget : public ::testing::TestWithParam<int32_t> {};

TEST_P(SchedulerBudget, TokenBudgetNeverExceeded) {
  const int32_t budget = GetParam();
  const uint32_t seed = scheduler_testing::test_seed();
  SCOPED_TRACE(scheduler_testing::seed_note(seed));
  std::mt19937 rng(seed);
  for (const Kind& k : kKinds) {
    SCOPED_TRACE(k.name);
    Driver d(make_config(k, 48, 8, budget, 6), rng());
    uint64_t next = 1;
    int full_steps = 0;
    for (int step = 0; step < 400; ++step) {
      if (rng() % 3 == 0) {
        ASSERT_TRUE(
            d.add(next++, random_tokens(rng, 1 + rng() % 700), 1 + rng() % 30, rng() % 3).ok());
      }
      ASSERT_EQ(d.step(), "") << "step " << step;  // audit() checks the budget and limits
      ASSERT_LE(d.plan().num_batched_tokens, budget);
      full_steps += d.plan().num_batched_tokens == budget;
    }
    drain(d);
    if (budget <= 64) {
      EXPECT_GT(full_steps, 0);  // reached, not only respected
    }
    EXPECT_EQ(d.check_outputs(), "");
  }
}
INSTANTIATE_TEST_SUITE_P(Budgets, SchedulerBudget, ::testing::Values(16, 64, 4096));

TEST(Scheduler, PrefillChunksEndAtCheckpointPositions) {
  const uint32_t seed = scheduler_testing::test_seed();
  SCOPED_TRACE(scheduler_testing::seed_note(seed));
  std::mt19937 rng(seed);
  SchedulerConfig c = make_config(kKinds[0], 64, 8, 1000, 4);
  c.checkpoint_interval = 2;
  Driver d(c, rng());
  const auto prompt = random_tokens(rng, 700);
  ASSERT_TRUE(d.add(1, prompt, 3).ok());
  // Checkpoints every 2 blocks (128, 256, 384, 512) and at the last full block (640).
  const std::vector<std::pair<int, int>> want = {{0, 128},   {128, 256}, {256, 384},
                                                 {384, 512}, {512, 640}, {640, 700}};
  for (auto [begin, end] : want) {
    ASSERT_EQ(d.step(), "");
    ASSERT_EQ(d.plan().seqs.size(), 1u);
    const SeqPlan& q = d.plan().seqs[0];
    EXPECT_EQ(q.start_pos, begin);
    EXPECT_EQ(q.start_pos + static_cast<int>(q.tokens.size()), end);
    EXPECT_EQ(q.save_to_slot >= 0, end % kPage == 0) << end;
    EXPECT_NE(q.save_to_slot, q.state_slot);
    EXPECT_EQ(q.sample, end == 700);
  }
  drain(d);
  // The same prompt plus more resumes from the checkpoint at 640 with its 10 pages.
  auto longer = prompt;
  longer.push_back(5);
  ASSERT_TRUE(d.add(2, longer, 3).ok());
  ASSERT_EQ(d.step(), "");
  const SeqPlan& q = d.plan().seqs[0];
  EXPECT_EQ(q.start_pos, 640);
  EXPECT_GE(q.restore_from_slot, 1);
  EXPECT_FALSE(q.fresh_state);
  EXPECT_EQ(q.page_table.size(), 11u);
  drain(d);
  EXPECT_EQ(d.check_outputs(), "");

  // Attention-only: no checkpoints, so one chunk.
  Driver a(make_config(kKinds[1], 64, 0, 1000, 4), rng());
  ASSERT_TRUE(a.add(1, prompt, 3).ok());
  ASSERT_EQ(a.step(), "");
  EXPECT_EQ(a.plan().seqs[0].tokens.size(), 700u);
  EXPECT_EQ(a.plan().seqs[0].state_slot, -1);
}

// With sparse checkpoints (only at a prompt's last full block), a prompt that departs from a
// cached one inside a shared prefix (a system prompt) gets a checkpoint where the shared blocks
// end, so the next prompt sharing them resumes there instead of computing everything.
TEST(Scheduler, CheckpointWhereAPromptDepartsFromACachedOne) {
  const uint32_t seed = scheduler_testing::test_seed();
  SCOPED_TRACE(scheduler_testing::seed_note(seed));
  std::mt19937 rng(seed);
  for (const Kind& k : {kKinds[0], kKinds[2]}) {
    SCOPED_TRACE(k.name);
    SchedulerConfig c = make_config(k, 64, 8, 4096, 4);
    c.checkpoint_interval = 100;
    Driver d(c, rng());
    const auto system = random_tokens(rng, 300);  // 4 full blocks (256 tokens) and 44 more
    auto with_tail = [&](int n) {
      auto t = system;
      for (int i = 0; i < n; ++i) t.push_back(static_cast<int32_t>(1000 + rng() % 997));
      return t;
    };
    // The first prompt: one chunk to its last full block (448), its checkpoint there.
    ASSERT_TRUE(d.add(1, with_tail(200), 2).ok());
    ASSERT_EQ(d.step(), "");
    EXPECT_EQ(d.plan().seqs[0].tokens.size(), 448u);
    drain(d);
    // The second shares 256 tokens of whole blocks with it but no checkpoint: it starts from 0
    // and ends its first chunk at 256 with a checkpoint.
    ASSERT_TRUE(d.add(2, with_tail(100), 2).ok());
    const std::vector<std::pair<int, int>> want = {{0, 256}, {256, 384}, {384, 400}};
    for (auto [begin, end] : want) {
      ASSERT_EQ(d.step(), "");
      ASSERT_EQ(d.plan().seqs.size(), 1u);
      const SeqPlan& q = d.plan().seqs[0];
      EXPECT_EQ(q.start_pos, begin);
      EXPECT_EQ(q.start_pos + static_cast<int>(q.tokens.size()), end);
      EXPECT_EQ(q.save_to_slot >= 0, end % kPage == 0) << end;
      EXPECT_EQ(q.fresh_state, begin == 0);
    }
    drain(d);
    // The third resumes from that checkpoint.
    ASSERT_TRUE(d.add(3, with_tail(150), 2).ok());
    ASSERT_EQ(d.step(), "");
    const SeqPlan& q = d.plan().seqs[0];
    EXPECT_EQ(q.start_pos, 256);
    EXPECT_GE(q.restore_from_slot, 1);
    EXPECT_FALSE(q.fresh_state);
    drain(d);
    EXPECT_EQ(d.check_outputs(), "");
  }
}

// Tiny page pool: decodes run out of pages, the lowest-priority request is preempted and later
// recomputed; every stream still equals the oracle with each token streamed exactly once.
TEST(Scheduler, PreemptionRecomputeKeepsOutputs) {
  const uint32_t seed = scheduler_testing::test_seed();
  SCOPED_TRACE(scheduler_testing::seed_note(seed));
  std::mt19937 rng(seed);
  for (const Kind& k : {kKinds[0], kKinds[1]}) {
    SCOPED_TRACE(k.name);
    Driver d(make_config(k, 6, 8, 256, 8), rng());  // 384 positions
    ASSERT_TRUE(d.add(1, random_tokens(rng, 100), 150, 2).ok());
    ASSERT_TRUE(d.add(2, random_tokens(rng, 100), 150, 1).ok());
    ASSERT_TRUE(d.add(3, random_tokens(rng, 100), 150, 0).ok());
    std::vector<uint64_t> preempted;
    int steps = 0;
    while (d.sched().has_unfinished()) {
      ASSERT_EQ(d.step(), "") << "step " << steps;
      ASSERT_LT(++steps, 5000);
      for (uint64_t id : d.plan().preempted) preempted.push_back(id);
    }
    ASSERT_FALSE(preempted.empty());
    EXPECT_EQ(preempted[0], 3u);              // lowest priority goes first
    EXPECT_EQ(d.preemptions().count(1), 0u);  // the highest never does
    ASSERT_EQ(d.finished().size(), 3u);
    for (uint64_t id = 1; id <= 3; ++id) {
      EXPECT_EQ(d.finished().at(id).cause, SchedFinish::kLength);
      EXPECT_EQ(d.stream(id).size(), 150u);
    }
    EXPECT_EQ(d.check_outputs(), "");
  }
}

// A prefix hit restores pages and state and must give exactly the tokens of a cold run.
TEST(Scheduler, PrefixHitMatchesMiss) {
  const uint32_t seed = scheduler_testing::test_seed();
  SCOPED_TRACE(scheduler_testing::seed_note(seed));
  std::mt19937 rng(seed);
  for (const Kind& k : kKinds) {
    SCOPED_TRACE(k.name);
    const auto base = random_tokens(rng, 300);
    auto second = base;
    for (int i = 0; i < 40; ++i) second.push_back(static_cast<int32_t>(rng() % 997));
    std::vector<int32_t> outputs[2];
    for (bool cache : {true, false}) {
      SchedulerConfig c = make_config(k, 64, 8, 512, 4);
      c.enable_prefix_cache = cache;
      Driver d(c, rng());
      ASSERT_TRUE(d.add(1, base, 5).ok());
      drain(d);
      ASSERT_TRUE(d.add(2, second, 12).ok());
      ASSERT_EQ(d.step(), "");
      const SeqPlan& q = d.plan().seqs[0];
      EXPECT_EQ(q.start_pos, cache ? 256 : 0);  // 4 full blocks of the first prompt
      EXPECT_EQ(q.restore_from_slot >= 0, cache && k.linear);
      EXPECT_EQ(q.fresh_state, !cache);
      drain(d);
      EXPECT_EQ(d.check_outputs(), "");
      outputs[cache] = d.stream(2);
    }
    EXPECT_EQ(outputs[0], outputs[1]);
    EXPECT_EQ(outputs[0].size(), 12u);
  }
}

// A queue head that cannot fit even after evicting the whole unused cache evicts nothing.
TEST(Scheduler, BlockedAdmissionKeepsTheCache) {
  const uint32_t seed = scheduler_testing::test_seed();
  SCOPED_TRACE(scheduler_testing::seed_note(seed));
  std::mt19937 rng(seed);
  Driver d(make_config(kKinds[1], 8, 0, 512, 4), rng());
  ASSERT_TRUE(d.add(1, random_tokens(rng, 257), 1).ok());
  ASSERT_EQ(d.step(), "");  // prefills, samples, finishes: 4 full blocks stay cached
  ASSERT_EQ(d.sched().prefix_cache()->num_entries(), 4);
  ASSERT_TRUE(d.add(2, random_tokens(rng, 150), 20).ok());  // holds 3 pages throughout
  ASSERT_EQ(d.step(), "");
  ASSERT_EQ(d.sched().prefix_cache()->num_entries(), 6);   // + its 2 full blocks, shared
  ASSERT_TRUE(d.add(3, random_tokens(rng, 380), 1).ok());  // needs 6: 1 free + 4 evictable
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(d.step(), "");
    EXPECT_EQ(d.sched().prefix_cache()->num_entries(), 6);
    EXPECT_EQ(d.sched().num_waiting(), 1);
  }
  drain(d);
  EXPECT_EQ(d.finished().size(), 3u);
  EXPECT_EQ(d.check_outputs(), "");
}

TEST(Scheduler, CancelReturnsEveryPageAndSlot) {
  const uint32_t seed = scheduler_testing::test_seed();
  SCOPED_TRACE(scheduler_testing::seed_note(seed));
  std::mt19937 rng(seed);
  for (const Kind& k : kKinds) {
    SCOPED_TRACE(k.name);
    SchedulerConfig c = make_config(k, 8, 4, 64, 8);
    c.enable_prefix_cache = false;
    Driver d(c, rng());
    ASSERT_TRUE(d.add(1, random_tokens(rng, 30), 400, 3).ok());   // will decode
    ASSERT_TRUE(d.add(2, random_tokens(rng, 200), 100, 2).ok());  // long prefill
    ASSERT_TRUE(d.add(3, random_tokens(rng, 30), 400, 1).ok());   // preempted later
    ASSERT_TRUE(d.add(4, random_tokens(rng, 30), 10, 0).ok());    // waits (3 usable slots)
    for (int i = 0; i < 3; ++i) ASSERT_EQ(d.step(), "");
    bool in_flight_cancelled = false;
    // Cancel request 2 while its step is in flight.
    ASSERT_EQ(d.step(nullptr,
                     [&](const BatchPlan& p) {
                       for (const SeqPlan& q : p.seqs) {
                         if (q.request_id != 2) continue;
                         // The plan views the request's own page table: it must stay readable
                         // (and unchanged) until complete(), though the request is gone.
                         const std::vector<int32_t> before(q.page_table.begin(),
                                                           q.page_table.end());
                         in_flight_cancelled = d.cancel(2).ok();
                         EXPECT_TRUE(std::equal(q.page_table.begin(), q.page_table.end(),
                                                before.begin(), before.end()));
                       }
                     }),
              "");
    EXPECT_TRUE(in_flight_cancelled);
    int steps = 0;
    while (k.attention && d.preemptions().count(3) == 0 && steps++ < 2000) ASSERT_EQ(d.step(), "");
    if (k.attention) {
      bool waiting = false;
      d.sched().for_each_request([&](const RequestView& r) {
        if (r.id == 3) waiting = !r.running;
      });
      EXPECT_TRUE(waiting);
      EXPECT_TRUE(d.cancel(3).ok());  // preempted
    }
    ASSERT_TRUE(d.cancel(1).ok());                              // running
    ASSERT_TRUE(d.cancel(4).ok() || d.finished().contains(4));  // waiting, running or done
    if (!k.attention) {
      ASSERT_TRUE(d.cancel(3).ok() || d.finished().contains(3));
    }
    EXPECT_EQ(audit(d.sched(), nullptr), "");
    EXPECT_EQ(d.sched().num_running() + d.sched().num_waiting(), 0);
    EXPECT_EQ(d.sched().kv_pool().free_count(), d.sched().kv_pool().capacity());
    EXPECT_EQ(d.sched().slot_pool().free_count(), d.sched().slot_pool().capacity());
    EXPECT_EQ(d.check_outputs(), "");  // the cancelled streams are oracle prefixes
  }
}

}  // namespace
}  // namespace loom
