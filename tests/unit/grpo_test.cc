// GRPO's arithmetic (trainer/rl/grpo.h) and the replay buffer (trainer/rl/replay_buffer.h):
// advantages with and without the std, the all-equal filter and the over-length penalty as numbers
// worked by hand; each token's clipped objective and its derivative with respect to logp against
// central differences on both sides of every clip edge, with the truncated importance weight and
// the k3 KL term; the replay buffer's capacity, age limit and draws.
#include "trainer/rl/grpo.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "trainer/rl/replay_buffer.h"

namespace loom {
namespace {

TEST(GrpoAdvantages, NormalisedByTheGroupStd) {
  GrpoOptions o;
  // mean 2, population std sqrt(2/3).
  const std::vector<double> a = group_advantages(std::vector<double>{3, 1, 2}, o);
  const double s = std::sqrt(2.0 / 3.0) + o.std_eps;
  EXPECT_NEAR(a[0], 1.0 / s, 1e-12);
  EXPECT_NEAR(a[1], -1.0 / s, 1e-12);
  EXPECT_NEAR(a[2], 0.0, 1e-12);
  // Binary rewards 1, 0, 0, 1: mean 0.5, std 0.5.
  const std::vector<double> b = group_advantages(std::vector<double>{1, 0, 0, 1}, o);
  EXPECT_NEAR(b[0], 0.5 / (0.5 + 1e-6), 1e-12);
  EXPECT_NEAR(b[1], -0.5 / (0.5 + 1e-6), 1e-12);
}

TEST(GrpoAdvantages, MeanOnlyWithoutStd) {
  GrpoOptions o;
  o.scale_by_std = false;
  const std::vector<double> a = group_advantages(std::vector<double>{3, 1, 2, 0}, o);
  EXPECT_DOUBLE_EQ(a[0], 1.5);
  EXPECT_DOUBLE_EQ(a[1], -0.5);
  EXPECT_DOUBLE_EQ(a[2], 0.5);
  EXPECT_DOUBLE_EQ(a[3], -1.5);
}

TEST(GrpoPenalty, OverlongIsZeroThenLinearThenFull) {
  GrpoOptions o;
  o.overlong_max_len = 10;
  o.overlong_buffer = 4;
  o.overlong_penalty = 0.5;
  EXPECT_EQ(overlong_penalty(6, o), 0.0);
  EXPECT_DOUBLE_EQ(overlong_penalty(8, o), -0.25);
  EXPECT_DOUBLE_EQ(overlong_penalty(10, o), -0.5);
  EXPECT_DOUBLE_EQ(overlong_penalty(50, o), -0.5);
  o.overlong_max_len = 0;
  o.overlong_buffer = 0;
  EXPECT_EQ(overlong_penalty(1000000, o), 0.0);
}

TrajectoryGroup group_of(std::vector<double> task_rewards, std::vector<int64_t> lengths) {
  TrajectoryGroup g;
  for (size_t i = 0; i < task_rewards.size(); ++i) {
    Trajectory tr;
    tr.task_reward = task_rewards[i];
    tr.response_tokens = lengths[i];
    g.members.push_back(tr);
  }
  return g;
}

TEST(GrpoFilter, DropsGroupsWhoseRewardsAreAllEqual) {
  GrpoOptions o;
  EXPECT_TRUE(rewards_all_equal(std::vector<double>{1, 1, 1}));
  EXPECT_FALSE(rewards_all_equal(std::vector<double>{1, 1, 0}));
  TrajectoryGroup same = group_of({1, 1, 1, 1}, {5, 6, 7, 8});
  EXPECT_FALSE(score_group(same, o));
  for (const Trajectory& tr : same.members) EXPECT_EQ(tr.advantage, 0.0);
  // Kept when the filter is off: every advantage 0 (r - mean = 0).
  o.drop_equal_reward_groups = false;
  EXPECT_TRUE(score_group(same, o));
  for (const Trajectory& tr : same.members) EXPECT_EQ(tr.advantage, 0.0);
  // The over-length penalty is part of the reward: equal task rewards, different lengths, kept.
  o.drop_equal_reward_groups = true;
  o.overlong_max_len = 10;
  o.overlong_buffer = 4;
  o.scale_by_std = false;
  TrajectoryGroup long_one = group_of({1, 1}, {4, 8});  // penalties 0 and -0.5
  EXPECT_TRUE(score_group(long_one, o));
  EXPECT_DOUBLE_EQ(long_one.members[1].reward, 0.5);
  EXPECT_DOUBLE_EQ(long_one.members[0].advantage, 0.25);
  EXPECT_DOUBLE_EQ(long_one.members[1].advantage, -0.25);
}

// Central difference of the token's loss with respect to logp.
double numeric_d_logp(TokenInputs in, const GrpoOptions& o) {
  const double h = 1e-6;
  in.logp += h;
  const double up = grpo_token_term(in, o).loss;
  in.logp -= 2 * h;
  const double down = grpo_token_term(in, o).loss;
  return (up - down) / (2 * h);
}

TEST(GrpoTokenTerm, ValuesAtTheClipEdges) {
  GrpoOptions o;  // clip [0.8, 1.28], tis_cap 2, no KL
  TokenInputs in{.logp = -1, .old_logp = -1, .behav_logp = -1, .advantage = 2};
  TokenTerm t = grpo_token_term(in, o);
  EXPECT_DOUBLE_EQ(t.loss, -2.0);  // ratio 1
  EXPECT_DOUBLE_EQ(t.d_logp, -2.0);
  EXPECT_FALSE(t.clipped);
  // A > 0, ratio 1.5 > 1.28: the clipped value, no gradient.
  in.logp = -1 + std::log(1.5);
  t = grpo_token_term(in, o);
  EXPECT_TRUE(t.clipped);
  EXPECT_NEAR(t.loss, -1.28 * 2, 1e-12);
  EXPECT_EQ(t.d_logp, 0.0);
  // A > 0, ratio 0.5 < 0.8: min picks r A, the gradient flows.
  in.logp = -1 + std::log(0.5);
  t = grpo_token_term(in, o);
  EXPECT_FALSE(t.clipped);
  EXPECT_NEAR(t.loss, -1.0, 1e-12);
  // A < 0, ratio 0.5: clipped at 0.8.
  in.advantage = -2;
  t = grpo_token_term(in, o);
  EXPECT_TRUE(t.clipped);
  EXPECT_NEAR(t.loss, 0.8 * 2, 1e-12);
  EXPECT_EQ(t.d_logp, 0.0);
  // The truncated importance weight: exp(old - behav) = 3 capped at 2, 0.5 kept.
  in = {.logp = -1, .old_logp = -1, .behav_logp = -1 - std::log(3.0), .advantage = 1};
  t = grpo_token_term(in, o);
  EXPECT_NEAR(t.tis, 2.0, 1e-12);
  EXPECT_NEAR(t.loss, -2.0, 1e-12);
  in.behav_logp = -1 + std::log(2.0);
  EXPECT_NEAR(grpo_token_term(in, o).tis, 0.5, 1e-12);
  o.tis_cap = 0;
  EXPECT_EQ(grpo_token_term(in, o).tis, 1.0);
  // k3: ref - logp = 0.3 gives e^0.3 - 1.3.
  o.kl_coef = 0.1;
  in = {.logp = -1, .old_logp = -1, .behav_logp = -1, .ref_logp = -0.7, .advantage = 0};
  t = grpo_token_term(in, o);
  EXPECT_NEAR(t.kl, std::exp(0.3) - 1.3, 1e-12);
  EXPECT_NEAR(t.loss, 0.1 * (std::exp(0.3) - 1.3), 1e-12);
}

// The derivative against central differences over a grid of ratios on both sides of both edges,
// both signs of the advantage, with and without TIS and KL. Points within 1e-4 of an edge (a kink)
// are skipped.
TEST(GrpoTokenTerm, DerivativeMatchesCentralDifferences) {
  int checked = 0, clipped = 0;
  for (const double kl : {0.0, 0.05}) {
    for (const double cap : {0.0, 2.0}) {
      GrpoOptions o;
      o.kl_coef = kl;
      o.tis_cap = cap;
      for (const double adv : {-1.3, -0.2, 0.7, 1.9}) {
        for (double ratio = 0.5; ratio <= 1.6; ratio += 0.0375) {
          if (std::abs(ratio - 0.8) < 1e-4 || std::abs(ratio - 1.28) < 1e-4) continue;
          TokenInputs in{.logp = -2 + std::log(ratio),
                         .old_logp = -2,
                         .behav_logp = -2.4,
                         .ref_logp = -1.7,
                         .advantage = adv};
          const TokenTerm t = grpo_token_term(in, o);
          EXPECT_NEAR(t.d_logp, numeric_d_logp(in, o), 1e-7 * (1 + std::abs(t.d_logp)))
              << "ratio " << ratio << " adv " << adv << " kl " << kl << " cap " << cap;
          ++checked;
          clipped += t.clipped;
        }
      }
    }
  }
  std::printf("[grpo] %d token terms checked, %d on the clipped branch\n", checked, clipped);
  EXPECT_GT(clipped, 0);
  EXPECT_LT(clipped, checked);
}

TEST(GrpoOptions, ValidateNamesTheField) {
  GrpoOptions o;
  EXPECT_TRUE(o.validate().ok());
  o.clip_low = 1.0;
  EXPECT_NE(o.validate().message().find("clip_low"), std::string::npos);
  o = {};
  o.tis_cap = 0.5;
  EXPECT_NE(o.validate().message().find("tis_cap"), std::string::npos);
  o = {};
  o.overlong_max_len = 10;
  EXPECT_NE(o.validate().message().find("overlong_buffer"), std::string::npos);
}

TrajectoryGroup at_version(int64_t v) {
  TrajectoryGroup g;
  g.version = v;
  g.task_seed = static_cast<uint64_t>(v);
  return g;
}

TEST(ReplayBuffer, KeepsTheNewestUpToCapacity) {
  ReplayBuffer buffer(3, 100);
  for (int64_t v = 1; v <= 5; ++v) buffer.add(at_version(v));
  EXPECT_EQ(buffer.size(), 3u);
  std::mt19937_64 rng(1);
  std::set<int64_t> seen;
  for (const TrajectoryGroup* g : buffer.sample(10, 6, rng)) seen.insert(g->version);
  EXPECT_EQ(seen, (std::set<int64_t>{3, 4, 5}));
  ReplayBuffer off(0, 1);
  off.add(at_version(1));
  EXPECT_EQ(off.size(), 0u);
}

TEST(ReplayBuffer, DrawsOnlyRecentEarlierVersionsWithoutRepeats) {
  ReplayBuffer buffer(10, 2);
  for (int64_t v = 1; v <= 5; ++v) buffer.add(at_version(v));
  std::mt19937_64 rng(7);
  // At version 5: versions 3 and 4 (5 is not earlier; 1 and 2 are too old and dropped).
  std::set<int64_t> seen;
  const auto drawn = buffer.sample(10, 5, rng);
  for (const TrajectoryGroup* g : drawn) seen.insert(g->version);
  EXPECT_EQ(drawn.size(), 2u);
  EXPECT_EQ(seen, (std::set<int64_t>{3, 4}));
  EXPECT_EQ(buffer.size(), 3u);  // 3, 4, 5 kept
  // One of two, uniformly: over many draws each appears.
  int threes = 0;
  for (int i = 0; i < 400; ++i) threes += buffer.sample(1, 5, rng)[0]->version == 3;
  EXPECT_GT(threes, 150);
  EXPECT_LT(threes, 250);
  EXPECT_TRUE(buffer.sample(0, 5, rng).empty());
}

}  // namespace
}  // namespace loom
