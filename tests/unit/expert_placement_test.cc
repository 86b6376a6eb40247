// The expert load balancer's arithmetic (engine/parallel/expert_placement.h): slot capacities,
// the contiguous layout the dispatcher had before, the balanced placement's validity, determinism
// and balance against that layout on skewed loads, route_expert and the load window.
#include "engine/parallel/expert_placement.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "engine/parallel/expert_parallel_dispatcher.h"

namespace loom {
namespace {

// Zipf-like loads (expert of popularity rank i gets ~ scale / (i + 1)^s) over a shuffled expert
// order, so that the hot experts are not simply the first ids (which the contiguous layout would
// put all on rank 0).
std::vector<int64_t> zipf_loads(int64_t experts, double s, uint32_t seed) {
  std::vector<int64_t> load(static_cast<size_t>(experts));
  for (int64_t i = 0; i < experts; ++i)
    load[i] = static_cast<int64_t>(std::llround(1e6 / std::pow(static_cast<double>(i + 1), s)));
  std::mt19937 rng(seed);
  std::shuffle(load.begin(), load.end(), rng);
  return load;
}

TEST(ExpertPlacement, CapacitiesSplitEvenlyFirstRanksOneMore) {
  EXPECT_EQ(expert_slot_capacities(72, 8), std::vector<int64_t>(8, 9));
  EXPECT_EQ(expert_slot_capacities(10, 3), (std::vector<int64_t>{4, 3, 3}));
  EXPECT_EQ(expert_slot_capacities(3, 3), (std::vector<int64_t>{1, 1, 1}));
}

TEST(ExpertPlacement, ContiguousIsTheDispatchersRanges) {
  for (int64_t e = 1; e <= 20; ++e)
    for (int n = 1; n <= e; ++n) {
      const ExpertPlacement p = contiguous_placement(e, n);
      ASSERT_TRUE(check_placement(p).ok()) << check_placement(p);
      for (int r = 0; r < n; ++r) {
        const ExpertRange range = expert_range_of_rank(e, r, n);
        std::vector<int32_t> want;
        for (int64_t x = range.begin; x < range.end; ++x) want.push_back(static_cast<int32_t>(x));
        EXPECT_EQ(p.rank_experts[r], want) << e << " experts over " << n;
      }
    }
}

TEST(ExpertPlacement, RefusesBadRedundancy) {
  EXPECT_TRUE(check_redundant_experts(64, 8, 0).ok());
  EXPECT_TRUE(check_redundant_experts(64, 8, 64 * 7).ok());
  EXPECT_FALSE(check_redundant_experts(64, 8, -1).ok());
  EXPECT_FALSE(check_redundant_experts(64, 8, 64 * 7 + 1).ok());  // a second copy on one rank
  EXPECT_FALSE(check_redundant_experts(64, 1, 1).ok());           // nothing to spread over
  EXPECT_FALSE(check_redundant_experts(4, 8, 8).ok());            // a rank without an expert
}

TEST(ExpertPlacement, UniformLoadsBalancePerfectly) {
  const std::vector<int64_t> uniform(64, 1000);
  EXPECT_DOUBLE_EQ(expert_load_balance(contiguous_placement(64, 8), uniform), 1.0);
  for (const int64_t k : {0, 8, 64}) {
    const ExpertPlacement p = balanced_placement(uniform, 8, k);
    ASSERT_TRUE(check_placement(p).ok()) << check_placement(p);
    EXPECT_DOUBLE_EQ(expert_load_balance(p, uniform), 1.0) << "K = " << k;
  }
  // No load at all is balanced too (nothing to carry).
  const std::vector<int64_t> none(16, 0);
  EXPECT_DOUBLE_EQ(expert_load_balance(balanced_placement(none, 4, 4), none), 1.0);
}

TEST(ExpertPlacement, ZipfLoadsBalanceFarBetterThanContiguous) {
  const int ranks = 8;
  const int64_t experts = 64, redundant = 8;
  for (uint32_t seed : {1u, 2u, 3u}) {
    const std::vector<int64_t> load = zipf_loads(experts, 1.0, seed);
    const double contiguous = expert_load_balance(contiguous_placement(experts, ranks), load);
    const ExpertPlacement p = balanced_placement(load, ranks, redundant);
    ASSERT_TRUE(check_placement(p).ok()) << check_placement(p);
    const double balanced = expert_load_balance(p, load);
    const double no_copies = expert_load_balance(balanced_placement(load, ranks, 0), load);
    std::printf(
        "zipf s=1 E=64 R=8 K=8 seed %u: balance contiguous %.4f, placed K=0 %.4f, "
        "placed K=8 %.4f\n",
        seed, contiguous, no_copies, balanced);
    // The bound of greedy list scheduling: no rank ends above the mean plus the heaviest copy
    // (a rank takes a copy only while it is the least loaded, so below the mean).
    const std::vector<double> loads = expert_rank_loads(p, load);
    const double mean = std::accumulate(loads.begin(), loads.end(), 0.0) / ranks;
    double heaviest_copy = 0;
    for (int64_t e = 0; e < experts; ++e)
      heaviest_copy = std::max(heaviest_copy, static_cast<double>(load[e]) / p.copies[e].size());
    EXPECT_LE(*std::max_element(loads.begin(), loads.end()), mean + heaviest_copy + 1e-6);
    // Copies of the hottest experts do better than moving whole experts, which does better than
    // the contiguous ranges; with 8 copies the hottest expert (21% of all load, 1.7 ranks' worth)
    // no longer decides the maximum, so the gain over the contiguous layout is large.
    EXPECT_GT(no_copies, contiguous);
    EXPECT_GT(balanced, no_copies);
    EXPECT_GT(balanced, contiguous * 1.5);
    // The hottest expert got a copy, and no rank holds two copies of one expert.
    const int64_t hottest = std::max_element(load.begin(), load.end()) - load.begin();
    EXPECT_GE(p.copies[hottest].size(), 2u);
    for (int64_t e = 0; e < experts; ++e) {
      const auto& c = p.copies[e];
      EXPECT_EQ(std::adjacent_find(c.begin(), c.end()), c.end()) << "expert " << e;
    }
  }
}

TEST(ExpertPlacement, ValidOnRandomShapes) {
  std::mt19937 rng(77);
  for (int trial = 0; trial < 300; ++trial) {
    const int ranks = 1 + static_cast<int>(rng() % 9);
    const int64_t experts = ranks + static_cast<int64_t>(rng() % 40);
    const int64_t redundant =
        ranks == 1 ? 0 : static_cast<int64_t>(rng() % (experts * (ranks - 1) + 1));
    std::vector<int64_t> load(static_cast<size_t>(experts));
    for (auto& l : load) l = rng() % 3 == 0 ? 0 : static_cast<int64_t>(rng() % 100000);
    const ExpertPlacement p = balanced_placement(load, ranks, redundant);
    ASSERT_TRUE(check_placement(p).ok())
        << check_placement(p) << " E " << experts << " R " << ranks << " K " << redundant;
    EXPECT_EQ(p.num_slots(), experts + redundant);
    for (const auto& c : p.copies) {
      EXPECT_GE(c.size(), 1u);
      EXPECT_LE(c.size(), static_cast<size_t>(ranks));
    }
  }
}

TEST(ExpertPlacement, CheckFindsBrokenPlacements) {
  ExpertPlacement p = balanced_placement(zipf_loads(16, 1.0, 5), 4, 4);
  ASSERT_TRUE(check_placement(p).ok());
  ExpertPlacement missing = p;  // an expert without copies
  const int32_t e = missing.rank_experts[0].back();
  missing.rank_experts[0].pop_back();
  std::erase(missing.copies[e], 0);
  EXPECT_FALSE(check_placement(missing).ok());
  ExpertPlacement over = p;  // rank 0 over its capacity, rank 1 under
  over.rank_experts[0].push_back(over.rank_experts[1].back());
  over.rank_experts[1].pop_back();
  EXPECT_FALSE(check_placement(over).ok());
}

TEST(ExpertPlacement, Deterministic) {
  const std::vector<int64_t> load = zipf_loads(256, 1.2, 9);
  const ExpertPlacement a = balanced_placement(load, 64, 32), b = balanced_placement(load, 64, 32);
  EXPECT_EQ(a.rank_experts, b.rank_experts);
  EXPECT_EQ(a.copies, b.copies);
  // Ties (equal loads) resolve by expert and rank id, never by chance.
  const std::vector<int64_t> equal(12, 5);
  EXPECT_EQ(balanced_placement(equal, 3, 3).copies, balanced_placement(equal, 3, 3).copies);
  EXPECT_EQ(balanced_placement(equal, 3, 3).copies[0].size(), 2u);  // lowest ids copied first
}

TEST(ExpertPlacement, RoutePrefersOwnCopyAndSpreadsTheOthers) {
  // Expert 0 hot (4 copies over 4 ranks of 6), the rest cold.
  std::vector<int64_t> load(12, 10);
  load[0] = 100000;
  const ExpertPlacement p = balanced_placement(load, 6, 3);
  ASSERT_TRUE(check_placement(p).ok());
  const auto& c = p.copies[0];
  ASSERT_EQ(c.size(), 4u);
  for (int r = 0; r < 6; ++r) {
    std::vector<int> hits(6, 0);
    for (int64_t t = 0; t < 400; ++t) {
      const int dest = route_expert(p, 0, t, r);
      EXPECT_TRUE(p.holds(dest, 0));
      ++hits[dest];
    }
    if (p.holds(r, 0)) {
      EXPECT_EQ(hits[r], 400) << "rank " << r << " holds a copy: its tokens stay";
    } else {
      for (const int32_t q : c) EXPECT_EQ(hits[q], 100) << "rank " << r << " to copy on " << q;
    }
  }
  // One token per rank (a decode step): the ranks without a copy start their turns at different
  // copies instead of all sending to the first.
  std::vector<int> first_token_hits(6, 0);
  for (int r = 0; r < 6; ++r)
    if (!p.holds(r, 0)) ++first_token_hits[route_expert(p, 0, 0, r)];
  EXPECT_EQ(*std::max_element(first_token_hits.begin(), first_token_hits.end()), 1);
  // A single-copy expert always goes to its one rank.
  for (int64_t e = 1; e < 12; ++e) {
    if (p.copies[e].size() != 1) continue;
    for (int r = 0; r < 6; ++r) EXPECT_EQ(route_expert(p, e, 17, r), p.copies[e][0]);
  }
}

TEST(ExpertLoadWindow, SumsTheLastStepsAndWrapsAround) {
  ExpertLoadWindow w(2, 3, 3);
  // Step s adds s + 1 to expert s % 3 of layer 0 and 10 to expert 0 of layer 1.
  std::vector<std::vector<int64_t>> layer0;  // per step
  for (int s = 0; s < 7; ++s) {
    if (s > 0) w.next_step();
    w.add(0, s % 3, s + 1);
    w.add(1, 0, 10);
    layer0.push_back({0, 0, 0});
    layer0.back()[s % 3] = s + 1;
    const int held = std::min(s + 1, 3);
    EXPECT_EQ(w.steps_held(), held);
    std::vector<int64_t> want(3, 0);
    for (int q = s + 1 - held; q <= s; ++q)
      for (int e = 0; e < 3; ++e) want[e] += layer0[q][e];
    const auto got = w.sum(0);
    EXPECT_EQ(std::vector<int64_t>(got.begin(), got.end()), want) << "step " << s;
    EXPECT_EQ(w.sum(1)[0], 10 * held);
    EXPECT_EQ(w.sum(1)[1], 0);
  }
  // After 7 steps the window holds steps 4, 5, 6: 5 on expert 1, 6 on expert 2, 7 on expert 0.
  EXPECT_EQ(w.sum(0)[0], 7);
  EXPECT_EQ(w.sum(0)[1], 5);
  EXPECT_EQ(w.sum(0)[2], 6);
}

}  // namespace
}  // namespace loom
