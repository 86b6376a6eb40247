// Quantile load balancing (MODELS.md): the bias update rule on counts whose quantiles are known
// from the definition, the health metrics, and the behaviour that matters: on a router whose
// scores strongly favour a few experts, selection with score + bias balances the load within a
// few hundred steps while the scores themselves never change.
#include "trainer/load_balancer.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace loom {
namespace {

TEST(CountQuantile, InterpolatesBetweenOrderStatistics) {
  const std::vector<int64_t> c = {40, 10, 30, 20};  // sorted: 10 20 30 40
  EXPECT_DOUBLE_EQ(count_quantile(c, 0.0), 10);
  EXPECT_DOUBLE_EQ(count_quantile(c, 1.0), 40);
  // Position q * (n - 1): 0.25 * 3 = 0.75 -> 10 + 0.75 * 10; 0.5 * 3 = 1.5 -> 25.
  EXPECT_DOUBLE_EQ(count_quantile(c, 0.25), 17.5);
  EXPECT_DOUBLE_EQ(count_quantile(c, 0.5), 25);
  EXPECT_DOUBLE_EQ(count_quantile(std::vector<int64_t>{7}, 0.3), 7);
}

TEST(QuantileBalance, MovesOnlyTheExpertsOutsideTheQuantiles) {
  QuantileBalancerOptions o;
  o.q_low = 0.25;
  o.q_high = 0.75;
  o.eta = 0.5;
  // Sorted 0 5 10 10 10 20 30 90: q_low at position 1.75 -> 5 + 0.75 * 5 = 8.75; q_high at
  // position 5.25 -> 20 + 0.25 * 10 = 22.5.
  const std::vector<int64_t> counts = {10, 90, 0, 30, 10, 5, 20, 10};
  std::vector<float> bias(8, 1.0f);
  const RoutingHealth h = quantile_balance_step(o, counts, bias);
  const std::vector<float> want = {1.0f, 0.5f, 1.5f, 0.5f, 1.0f, 1.5f, 1.0f, 1.0f};
  EXPECT_EQ(bias, want);
  EXPECT_EQ(h.raised, 2);
  EXPECT_EQ(h.lowered, 2);
  EXPECT_DOUBLE_EQ(h.bias_update_l1, 2.0);
  // 175 tokens over 8 experts: mean 21.875, max 90.
  EXPECT_DOUBLE_EQ(h.max_violation, (90 - 21.875) / 21.875);
  EXPECT_DOUBLE_EQ(h.idle_fraction, 1.0 / 8);
  double entropy = 0;
  for (int64_t c : counts)
    if (c > 0) entropy -= c / 175.0 * std::log(c / 175.0);
  EXPECT_NEAR(h.load_entropy, entropy / std::log(8.0), 1e-12);
  const auto warnings = routing_warnings(o, 3, h);
  ASSERT_EQ(warnings.size(), 3u);  // entropy, violation and idle thresholds all crossed
  EXPECT_NE(warnings[0].find("layer 3"), std::string::npos);
}

// A collapsed router: two experts take every token, so the q_low quantile is 0 and no count is
// below it. The idle experts sit at that quantile with fewer tokens than the mean and are raised;
// so are they when one expert takes everything (then q_high is 0 too).
TEST(QuantileBalance, RaisesTheIdleExpertsOfACollapsedRouter) {
  QuantileBalancerOptions o;
  o.eta = 0.5;
  {
    const std::vector<int64_t> counts = {0, 0, 512, 0, 0, 512, 0, 0};
    std::vector<float> bias(8, 0.0f);
    const RoutingHealth h = quantile_balance_step(o, counts, bias);
    const std::vector<float> want = {0.5f, 0.5f, -0.5f, 0.5f, 0.5f, -0.5f, 0.5f, 0.5f};
    EXPECT_EQ(bias, want);
    EXPECT_EQ(h.raised, 6);
    EXPECT_EQ(h.lowered, 2);
    EXPECT_DOUBLE_EQ(h.idle_fraction, 0.75);
  }
  {
    const std::vector<int64_t> counts = {0, 0, 0, 300, 0};
    std::vector<float> bias(5, 1.0f);
    const RoutingHealth h = quantile_balance_step(o, counts, bias);
    EXPECT_EQ(bias, (std::vector<float>{1.5f, 1.5f, 1.5f, 0.5f, 1.5f}));
    EXPECT_EQ(h.raised, 4);
    EXPECT_EQ(h.lowered, 1);
  }
  {
    // Two load levels: each side moves toward the mean (11); nobody sits still at a tie.
    const std::vector<int64_t> counts = {10, 12, 10, 12, 10, 12, 10, 12};
    std::vector<float> bias(8, 0.0f);
    quantile_balance_step(o, counts, bias);
    EXPECT_EQ(bias, (std::vector<float>{0.5f, -0.5f, 0.5f, -0.5f, 0.5f, -0.5f, 0.5f, -0.5f}));
  }
}

TEST(QuantileBalance, UniformLoadIsHealthyAndUntouched) {
  QuantileBalancerOptions o;
  const std::vector<int64_t> counts(16, 100);
  std::vector<float> bias(16, 0.25f);
  const RoutingHealth h = quantile_balance_step(o, counts, bias);
  EXPECT_EQ(bias, std::vector<float>(16, 0.25f));
  EXPECT_DOUBLE_EQ(h.max_violation, 0.0);
  EXPECT_NEAR(h.load_entropy, 1.0, 1e-12);
  EXPECT_TRUE(routing_warnings(o, 0, h).empty());
}

TEST(QuantileBalance, BalancesASkewedRouterWithoutTouchingItsScores) {
  // 32 experts, top-4 of score + bias; expert e's score has mean 3 * e / 32 (the last experts
  // win most tokens) plus unit noise per token.
  const int E = 32, K = 4, tokens = 2048;
  std::mt19937 rng(5);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  std::vector<float> bias(E, 0.0f), score(E), key(E);
  QuantileBalancerOptions o;
  o.eta = 0.01;
  auto route = [&]() {
    std::vector<int64_t> counts(E, 0);
    std::vector<int> order(E);
    for (int t = 0; t < tokens; ++t) {
      for (int e = 0; e < E; ++e) {
        score[e] = 3.0f * e / E + noise(rng);
        key[e] = score[e] + bias[e];
      }
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + K, order.end(),
                        [&](int a, int b) { return key[a] > key[b]; });
      for (int i = 0; i < K; ++i) ++counts[order[i]];
    }
    return counts;
  };
  RoutingHealth first, last;
  for (int step = 0; step < 400; ++step) {
    const std::vector<int64_t> counts = route();
    const RoutingHealth h = quantile_balance_step(o, counts, bias);
    if (step == 0) first = h;
    last = h;
  }
  std::printf("[balance] max violation %.3f -> %.3f, entropy %.4f -> %.4f\n", first.max_violation,
              last.max_violation, first.load_entropy, last.load_entropy);
  EXPECT_GT(first.max_violation, 1.5);  // heavily skewed at the start
  EXPECT_LT(last.max_violation, 0.3);   // balanced after 400 steps
  EXPECT_GT(last.load_entropy, 0.995);
  // The bias undid the score skew: the favoured experts ended with the lowest bias.
  EXPECT_LT(bias[E - 1], bias[0]);
}

TEST(QuantileBalance, RejectsBadOptions) {
  QuantileBalancerOptions o;
  o.q_low = 0.8;
  o.q_high = 0.2;
  EXPECT_NE(o.validate().message().find("q_low"), std::string::npos);
  o = {};
  o.eta = -1;
  EXPECT_NE(o.validate().message().find("eta"), std::string::npos);
  EXPECT_TRUE(QuantileBalancerOptions{}.validate().ok());
}

}  // namespace
}  // namespace loom
