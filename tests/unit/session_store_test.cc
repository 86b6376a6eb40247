// The two halves of engine sessions, apart from the engine: SessionStore (engine/session_store.h:
// names, token histories, turns, the ttl, max_sessions, delete) and ParkedSequences
// (scheduler/parked_sequences.h: the kept end-of-turn caches, their per-sequence and total byte
// budgets and least-recently-parked eviction). session_engine_test covers them inside the engine;
// these pin each rule on its own, with a fake clock and hand-made page and slot handles.
#include "engine/session_store.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "absl/time/time.h"
#include "scheduler/id_pool.h"
#include "scheduler/parked_sequences.h"

namespace loom {
namespace {

using Tokens = std::vector<int32_t>;

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);

// Starts and completes one turn of `name` at `now`: the history becomes the prompt plus `reply`.
uint64_t run_turn(SessionStore& store, const std::string& name, const Tokens& new_tokens,
                  const Tokens& reply, absl::Time now) {
  auto turn = store.begin_turn(name, new_tokens, now);
  EXPECT_TRUE(turn.ok()) << turn.status();
  Tokens history = turn->prompt;
  history.insert(history.end(), reply.begin(), reply.end());
  EXPECT_TRUE(store.end_turn(turn->key, history, now));
  return turn->key;
}

TEST(SessionStoreTest, TurnsAppendToTheHistory) {
  SessionStore store(4, absl::Seconds(60));
  auto first = store.begin_turn("a", Tokens{1, 2, 3}, kT0);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->prompt, (Tokens{1, 2, 3}));
  EXPECT_EQ(first->continued, 0);
  ASSERT_TRUE(store.end_turn(first->key, Tokens{1, 2, 3, 9}, kT0));
  auto second = store.begin_turn("a", Tokens{4}, kT0 + absl::Seconds(1));
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->key, first->key);
  EXPECT_EQ(second->prompt, (Tokens{1, 2, 3, 9, 4}));
  EXPECT_EQ(second->continued, 4);
  // Cancelled or failed: the history stays as it was before the turn.
  ASSERT_TRUE(store.end_turn(second->key, std::nullopt, kT0 + absl::Seconds(2)));
  EXPECT_EQ(store.stats().history_tokens, 4);
  auto third = store.begin_turn("a", Tokens{5}, kT0 + absl::Seconds(3));
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(third->prompt, (Tokens{1, 2, 3, 9, 5}));
}

TEST(SessionStoreTest, BusySessionRefusesASecondTurn) {
  SessionStore store(4, absl::Seconds(60));
  auto turn = store.begin_turn("a", Tokens{1}, kT0);
  ASSERT_TRUE(turn.ok());
  auto again = store.begin_turn("a", Tokens{2}, kT0);
  EXPECT_TRUE(absl::IsFailedPrecondition(again.status())) << again.status();
  // A busy session is never expired, however long its turn runs.
  EXPECT_TRUE(store.expire(kT0 + absl::Hours(10)).empty());
  EXPECT_EQ(store.next_expiry(), absl::InfiniteFuture());
}

TEST(SessionStoreTest, MaxSessionsRefusesANewOneButNotAContinuation) {
  SessionStore store(2, absl::Seconds(60));
  run_turn(store, "a", {1}, {2}, kT0);
  run_turn(store, "b", {1}, {2}, kT0);
  auto c = store.begin_turn("c", Tokens{1}, kT0);
  EXPECT_TRUE(absl::IsResourceExhausted(c.status())) << c.status();
  EXPECT_NE(c.status().message().find("at most 2 sessions"), std::string::npos) << c.status();
  EXPECT_TRUE(store.begin_turn("a", Tokens{3}, kT0).ok());
  EXPECT_EQ(store.stats().sessions, 2);
}

TEST(SessionStoreTest, AbortUndoesATurnThatWasNeverQueued) {
  SessionStore store(4, absl::Seconds(60));
  auto created = store.begin_turn("new", Tokens{1}, kT0);
  ASSERT_TRUE(created.ok());
  store.abort_turn(created->key);  // created by the refused turn: gone
  EXPECT_EQ(store.stats().sessions, 0);
  EXPECT_TRUE(absl::IsNotFound(store.erase("new").status()));

  run_turn(store, "old", {1, 2}, {3}, kT0);
  auto cont = store.begin_turn("old", Tokens{4}, kT0);
  ASSERT_TRUE(cont.ok());
  store.abort_turn(cont->key);  // existed before: idle again, history kept
  auto next = store.begin_turn("old", Tokens{5}, kT0);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->prompt, (Tokens{1, 2, 3, 5}));
}

TEST(SessionStoreTest, TtlExpiresIdleSessions) {
  SessionStore store(4, absl::Seconds(60));
  const uint64_t a = run_turn(store, "a", {1}, {2}, kT0);
  const uint64_t b = run_turn(store, "b", {1, 2}, {3}, kT0 + absl::Seconds(30));
  EXPECT_EQ(store.next_expiry(), kT0 + absl::Seconds(60));
  EXPECT_TRUE(store.expire(kT0 + absl::Seconds(59)).empty());
  EXPECT_EQ(store.expire(kT0 + absl::Seconds(60)), std::vector<uint64_t>{a});
  EXPECT_EQ(store.next_expiry(), kT0 + absl::Seconds(90));
  EXPECT_EQ(store.stats().sessions, 1);
  EXPECT_EQ(store.stats().expired, 1);
  EXPECT_EQ(store.stats().history_tokens, 3);
  // Use refreshes the clock: b's turn at 80 s moves its expiry to 140 s.
  run_turn(store, "b", {4}, {5}, kT0 + absl::Seconds(80));
  EXPECT_TRUE(store.expire(kT0 + absl::Seconds(139)).empty());
  EXPECT_EQ(store.expire(kT0 + absl::Seconds(140)), std::vector<uint64_t>{b});
  EXPECT_EQ(store.stats().history_tokens, 0);
}

TEST(SessionStoreTest, ExpiredButNotYetSweptSessionStartsOver) {
  SessionStore store(4, absl::Seconds(60));
  const uint64_t old_key = run_turn(store, "a", {1, 2}, {3}, kT0);
  // The loop has not swept it yet; a turn past its ttl must not see the old history.
  auto turn = store.begin_turn("a", Tokens{7}, kT0 + absl::Seconds(61));
  ASSERT_TRUE(turn.ok());
  EXPECT_NE(turn->key, old_key);
  EXPECT_EQ(turn->prompt, (Tokens{7}));
  EXPECT_EQ(turn->continued, 0);
  EXPECT_EQ(store.stats().expired, 1);
}

TEST(SessionStoreTest, EraseAndUnknownNames) {
  SessionStore store(4, absl::Seconds(60));
  EXPECT_TRUE(absl::IsNotFound(store.erase("nobody").status()));
  const uint64_t key = run_turn(store, "a", {1}, {2}, kT0);
  auto erased = store.erase("a");
  ASSERT_TRUE(erased.ok());
  EXPECT_EQ(*erased, key);
  EXPECT_TRUE(absl::IsNotFound(store.erase("a").status()));
  EXPECT_EQ(store.stats().sessions, 0);
  // A turn still running when its session is deleted ends without keeping anything.
  auto running = store.begin_turn("b", Tokens{1}, kT0);
  ASSERT_TRUE(running.ok());
  ASSERT_TRUE(store.erase("b").ok());
  EXPECT_FALSE(store.end_turn(running->key, Tokens{1, 2}, kT0));
  EXPECT_EQ(store.stats().history_tokens, 0);
  // The name can be used again: a new session with a new key.
  auto again = store.begin_turn("a", Tokens{5}, kT0);
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again->key, key);
  EXPECT_EQ(again->prompt, (Tokens{5}));
}

TEST(SessionStoreTest, WholePromptContinuesOnlyAProperPrefix) {
  SessionStore store(4, absl::Seconds(60));
  const uint64_t key = run_turn(store, "a", {1, 2}, {3}, kT0);
  auto cont = store.begin_turn("a", Tokens{1, 2, 3, 4}, kT0, /*whole=*/true);
  ASSERT_TRUE(cont.ok());
  EXPECT_EQ(cont->key, key);
  EXPECT_EQ(cont->continued, 3);
  EXPECT_EQ(cont->dropped, 0u);
  EXPECT_EQ(cont->prompt, (Tokens{1, 2, 3, 4}));
  ASSERT_TRUE(store.end_turn(cont->key, Tokens{1, 2, 3, 4, 5}, kT0));
  // Diverging (a fork, another rendering): the session starts over, the old one is reported.
  auto fork = store.begin_turn("a", Tokens{1, 2, 8, 4}, kT0, /*whole=*/true);
  ASSERT_TRUE(fork.ok());
  EXPECT_EQ(fork->dropped, key);
  EXPECT_NE(fork->key, key);
  EXPECT_EQ(fork->continued, 0);
  ASSERT_TRUE(store.end_turn(fork->key, Tokens{1, 2, 8, 4, 6}, kT0));
  // Equal to the history is not a proper prefix: nothing would be left to feed.
  auto same = store.begin_turn("a", Tokens{1, 2, 8, 4, 6}, kT0, /*whole=*/true);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->dropped, fork->key);
  EXPECT_EQ(same->continued, 0);
}

// Page and slot handles from real pools, so the accounting sees what the scheduler hands over.
struct Pools {
  IdPool pages{64, 1};
  IdPool slots{8, 1};
  ParkedSequence seq(int32_t npages, bool slot) {
    ParkedSequence s;
    EXPECT_TRUE(pages.allocate(npages, &s.pages));
    if (slot) s.slot = slots.allocate_one();
    s.num_computed = npages * 64;
    return s;
  }
};

TEST(ParkedSequencesTest, AccountsPagesSlotsAndBytes) {
  Pools pools;
  {
    ParkedSequences parked({.page_bytes = 100, .slot_bytes = 1000});
    ParkedSequence s = pools.seq(3, true);
    EXPECT_EQ(parked.bytes_of(s), 1300);
    ASSERT_TRUE(parked.park(7, std::move(s)));
    EXPECT_EQ(parked.count(), 1);
    EXPECT_EQ(parked.pages(), 3);
    EXPECT_EQ(parked.slots(), 1);
    EXPECT_EQ(parked.bytes(), 1300);
    EXPECT_EQ(pools.pages.free_count(), 61);
    // Parking under the same key replaces (and frees) what was there.
    ASSERT_TRUE(parked.park(7, pools.seq(1, false)));
    EXPECT_EQ(parked.count(), 1);
    EXPECT_EQ(parked.bytes(), 100);
    EXPECT_EQ(pools.pages.free_count(), 63);
    EXPECT_EQ(pools.slots.free_count(), 8);
  }
  // Destroying the cache frees everything it held.
  EXPECT_EQ(pools.pages.free_count(), 64);
}

TEST(ParkedSequencesTest, PerSequenceBudgetRefusesAndFrees) {
  Pools pools;
  ParkedSequences parked({.page_bytes = 100, .slot_bytes = 1000, .max_bytes_per_sequence = 1200});
  EXPECT_TRUE(parked.park(1, pools.seq(2, true)));   // 1200: at the limit
  EXPECT_FALSE(parked.park(2, pools.seq(3, true)));  // 1300: over it
  EXPECT_FALSE(parked.contains(2));
  EXPECT_EQ(parked.count(), 1);
  EXPECT_EQ(pools.pages.free_count(), 62);  // the refused sequence's pages went back
  EXPECT_EQ(pools.slots.free_count(), 7);
  EXPECT_EQ(parked.evictions(), 0);  // a refusal is not an eviction
}

TEST(ParkedSequencesTest, TotalBudgetEvictsLeastRecentlyParkedFirst) {
  Pools pools;
  ParkedSequences parked({.page_bytes = 100, .slot_bytes = 0, .max_bytes = 500});
  ASSERT_TRUE(parked.park(1, pools.seq(2, false)));  // 200
  ASSERT_TRUE(parked.park(2, pools.seq(1, false)));  // 300
  ASSERT_TRUE(parked.park(3, pools.seq(2, false)));  // 500: fits exactly
  EXPECT_EQ(parked.evictions(), 0);
  // Re-parking 1 (its next turn ended) makes it the most recent: 2 is now the oldest.
  auto one = parked.take(1);
  ASSERT_TRUE(one.has_value());
  ASSERT_TRUE(parked.park(1, std::move(*one)));
  // 200 more: evicts 2 (100) then 3 (200), the oldest first, until 1 and the new one fit.
  ASSERT_TRUE(parked.park(4, pools.seq(2, false)));
  EXPECT_FALSE(parked.contains(2));
  EXPECT_FALSE(parked.contains(3));
  EXPECT_TRUE(parked.contains(1));
  EXPECT_TRUE(parked.contains(4));
  EXPECT_EQ(parked.evictions(), 2);
  EXPECT_EQ(parked.bytes(), 400);
  // A sequence larger than the whole budget is refused without evicting anyone.
  EXPECT_FALSE(parked.park(5, pools.seq(6, false)));
  EXPECT_EQ(parked.count(), 2);
  EXPECT_EQ(parked.evictions(), 2);
  // Pressure eviction (the scheduler's) follows the same order.
  ASSERT_TRUE(parked.evict_lru());
  EXPECT_FALSE(parked.contains(1));
  EXPECT_TRUE(parked.contains(4));
  ASSERT_TRUE(parked.evict_lru());
  EXPECT_FALSE(parked.evict_lru());
  EXPECT_EQ(parked.evictions(), 4);
  EXPECT_EQ(parked.bytes(), 0);
  EXPECT_EQ(pools.pages.free_count(), 64);
}

TEST(ParkedSequencesTest, TakePutBackDropAndUnknownKeys) {
  Pools pools;
  ParkedSequences parked({.page_bytes = 100, .slot_bytes = 10});
  EXPECT_FALSE(parked.take(42).has_value());
  parked.drop(42);  // unknown: nothing happens
  EXPECT_FALSE(parked.evict_lru());
  ASSERT_TRUE(parked.park(1, pools.seq(1, true)));
  ASSERT_TRUE(parked.park(2, pools.seq(1, true)));
  auto one = parked.take(1);
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(one->pages.size(), 1u);
  EXPECT_TRUE(one->slot.valid());
  EXPECT_EQ(one->num_computed, 64);
  EXPECT_FALSE(parked.contains(1));
  EXPECT_EQ(parked.bytes(), 110);
  // An admission that did not go through: 1 goes back to its old place, still the oldest.
  parked.put_back(1, *std::move(one));
  EXPECT_EQ(parked.bytes(), 220);
  ASSERT_TRUE(parked.evict_lru());
  EXPECT_FALSE(parked.contains(1));
  EXPECT_TRUE(parked.contains(2));
  parked.drop(2);  // a deleted session: dropped, not counted as an eviction
  EXPECT_EQ(parked.count(), 0);
  EXPECT_EQ(parked.evictions(), 1);
  EXPECT_EQ(pools.pages.free_count(), 64);
  EXPECT_EQ(pools.slots.free_count(), 8);
}

}  // namespace
}  // namespace loom
