// Expected values are worked out by hand from the definition in latency_stats.h (rank
// h = (n - 1) * q / 100, linear between the neighbouring order statistics); they equal numpy's
// np.percentile(x, q) with its default method.
#include "bench/serve/latency_stats.h"

#include <vector>

#include "gtest/gtest.h"

namespace loom::bench {
namespace {

constexpr double kEps = 1e-12;

double pct(const std::vector<double>& sorted, double q) {
  std::optional<double> v = percentile_of_sorted(sorted, q);
  EXPECT_TRUE(v.has_value());
  return v.value_or(-1);
}

TEST(LatencyStats, EvenCountInterpolatesBetweenRanks) {
  const std::vector<double> x = {1, 2, 3, 4};
  EXPECT_NEAR(pct(x, 0), 1.0, kEps);
  EXPECT_NEAR(pct(x, 25), 1.75, kEps);  // h = 0.75
  EXPECT_NEAR(pct(x, 50), 2.5, kEps);   // h = 1.5: mean of the two middle values
  EXPECT_NEAR(pct(x, 90), 3.7, kEps);   // h = 2.7
  EXPECT_NEAR(pct(x, 99), 3.97, kEps);  // h = 2.97
  EXPECT_NEAR(pct(x, 100), 4.0, kEps);
}

TEST(LatencyStats, OddCountHitsTheMiddleSample) {
  const std::vector<double> x = {10, 20, 30, 40, 50};
  EXPECT_NEAR(pct(x, 10), 14.0, kEps);  // h = 0.4
  EXPECT_NEAR(pct(x, 50), 30.0, kEps);  // h = 2 exactly
  EXPECT_NEAR(pct(x, 90), 46.0, kEps);  // h = 3.6
  EXPECT_NEAR(pct(x, 99), 49.6, kEps);  // h = 3.96
}

TEST(LatencyStats, TiesAndASingleSample) {
  const std::vector<double> ties = {2, 2, 2, 8};
  EXPECT_NEAR(pct(ties, 50), 2.0, kEps);  // h = 1.5 between two 2s
  EXPECT_NEAR(pct(ties, 90), 6.2, kEps);  // h = 2.7: 2 + 0.7 * 6
  const std::vector<double> one = {7.5};
  for (double q : {0.0, 50.0, 90.0, 99.0, 100.0}) EXPECT_EQ(pct(one, q), 7.5) << q;
}

TEST(LatencyStats, EmptyInputHasNoStatistics) {
  EXPECT_FALSE(percentile_of_sorted({}, 50).has_value());
  EXPECT_FALSE(summarize({}).has_value());
}

TEST(LatencyStats, SummarizeSortsAndAverages) {
  std::optional<LatencySummary> s = summarize({5, 1, 4, 2, 3});
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->count, 5);
  EXPECT_NEAR(s->mean, 3.0, kEps);
  EXPECT_EQ(s->min, 1.0);
  EXPECT_EQ(s->max, 5.0);
  EXPECT_NEAR(s->p50, 3.0, kEps);
  EXPECT_NEAR(s->p90, 4.6, kEps);   // h = 3.6 over 1..5
  EXPECT_NEAR(s->p99, 4.96, kEps);  // h = 3.96

  std::optional<LatencySummary> single = summarize({0.25});
  ASSERT_TRUE(single.has_value());
  EXPECT_EQ(single->count, 1);
  EXPECT_EQ(single->mean, 0.25);
  EXPECT_EQ(single->p50, 0.25);
  EXPECT_EQ(single->p99, 0.25);
}

TEST(LatencyStatsDeathTest, OutOfRangeQuantileIsACallerBug) {
  const std::vector<double> x = {1, 2};
  EXPECT_DEATH(percentile_of_sorted(x, 101), "must be in \\[0, 100\\]");
  EXPECT_DEATH(percentile_of_sorted(x, -1), "must be in \\[0, 100\\]");
  const std::vector<double> unsorted = {2, 1};
  EXPECT_DEATH(percentile_of_sorted(unsorted, 50), "ascending");
}

}  // namespace
}  // namespace loom::bench
