// How accumulate_policy_gradient (trainer/rl/policy_loss.h) saves passes. scored_version:
// trajectories sampled under the weight version the trainer still holds since it scored them
// reuse their old_logp as the current logprobs instead of running the same forward again; the
// objective, its statistics and the gradient are then bit for bit those of the recomputing call,
// and a trajectory of another version is recomputed. pack_tokens: packed forward and backward
// passes (Model::loss_and_gradients_packed, the GPU default) give the per-trajectory calls'
// statistics exactly and their gradients up to f32 summation order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "engine/model/gradients.h"
#include "engine/model/model.h"
#include "trainer/rl/policy_loss.h"

namespace loom {
namespace {

std::unique_ptr<Model> tiny_model() {
  Placement p;
  p.trainable = true;
  auto m =
      Model::load_random(std::string(LOOM_SOURCE_DIR) + "/tests/long/rl_tiny_config.json", 5, p);
  EXPECT_TRUE(m.ok()) << m.status();
  return std::move(m).value();
}

// Two scored trajectories (as the RL loop scores them: old_logp from the trainer's forward),
// sampled under weight versions 3 and 2, with behaviour logprobs a little off.
std::vector<Trajectory> scored(const Model& model) {
  std::mt19937 rng(4);
  std::uniform_int_distribution<int32_t> id(0, 255);
  std::normal_distribution<float> jitter(0.0f, 0.1f);
  std::vector<Trajectory> trs(2);
  for (int k = 0; k < 2; ++k) {
    Trajectory& tr = trs[k];
    for (int t = 0; t < 23 + 4 * k; ++t) tr.tokens.push_back(id(rng));
    tr.sampled.assign(tr.tokens.size(), 0);
    for (size_t t = 8; t + 1 < tr.tokens.size(); ++t) tr.sampled[t] = 1;
    auto logp = token_logprobs(model, tr.tokens);
    EXPECT_TRUE(logp.ok()) << logp.status();
    tr.old_logp = tr.behav_logp = *logp;
    for (float& b : tr.behav_logp) b += jitter(rng);
    tr.advantage = k == 0 ? 1.0 : -1.0;
    tr.version = 3 - k;
  }
  return trs;
}

void expect_same(const PolicyLossStats& a, const PolicyLossStats& b) {
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.entropy, b.entropy);
  EXPECT_EQ(a.tis_mean, b.tis_mean);
  EXPECT_EQ(a.ratio_mean, b.ratio_mean);
  EXPECT_EQ(a.clip_fraction, b.clip_fraction);
}

TEST(RlPolicyLossReuse, ReusedLogprobsGiveTheRecomputedBits) {
  const std::unique_ptr<Model> model = tiny_model();
  const std::vector<Trajectory> trs = scored(*model);
  const std::vector<const Trajectory*> batch = {&trs[0], &trs[1]};
  Gradients recomputed_grads, reused_grads;
  auto recomputed = accumulate_policy_gradient(*model, batch, GrpoOptions{}, recomputed_grads);
  ASSERT_TRUE(recomputed.ok()) << recomputed.status();
  auto reused = accumulate_policy_gradient(*model, batch, GrpoOptions{}, reused_grads, false, 3);
  ASSERT_TRUE(reused.ok()) << reused.status();
  expect_same(*reused, *recomputed);
  EXPECT_EQ(recomputed->ratio_mean, 1.0);  // on-policy: the forward gives old_logp again
  int tensors = 0;
  for (const ParameterArena::Entry& e : model->parameters().entries()) {
    const Tensor* a = recomputed_grads.find(e.name);
    const Tensor* b = reused_grads.find(e.name);
    ASSERT_EQ(a == nullptr, b == nullptr) << e.name;
    if (a == nullptr) continue;
    ++tensors;
    EXPECT_EQ(std::memcmp(a->raw(), b->raw(), a->nbytes()), 0) << e.name;
  }
  EXPECT_GT(tensors, 0);
}

TEST(RlPolicyLossReuse, OnlyTheScoredVersionIsReused) {
  const std::unique_ptr<Model> model = tiny_model();
  std::vector<Trajectory> trs = scored(*model);
  // Stale old logprobs (as if scored under other weights): where they are reused the ratio is 1,
  // where the forward runs it is exp(0.05) on every response token.
  for (Trajectory& tr : trs)
    for (float& v : tr.old_logp) v -= 0.05f;
  for (const auto& [version, ratio_of_first, ratio_of_second] :
       {std::tuple{3, 1.0, std::exp(0.05)}, {2, std::exp(0.05), 1.0}}) {
    for (int k = 0; k < 2; ++k) {
      const std::vector<const Trajectory*> one = {&trs[k]};
      Gradients grads;
      auto s = accumulate_policy_gradient(*model, one, GrpoOptions{}, grads, false, version);
      ASSERT_TRUE(s.ok()) << s.status();
      EXPECT_NEAR(s->ratio_mean, k == 0 ? ratio_of_first : ratio_of_second, 1e-5)
          << "scored version " << version << ", trajectory of version " << trs[k].version;
    }
  }
}

TEST(RlPolicyLossReuse, PackedPassesGiveThePerTrajectoryGradient) {
  const std::unique_ptr<Model> model = tiny_model();
  std::vector<Trajectory> trs = scored(*model);
  std::vector<Trajectory> more = scored(*model);  // four trajectories of 23 and 27 tokens
  trs.insert(trs.end(), more.begin(), more.end());
  trs[2].advantage = 0.5;
  const std::vector<const Trajectory*> batch = {&trs[0], &trs[1], &trs[2], &trs[3]};
  Gradients single_grads;
  auto single = accumulate_policy_gradient(*model, batch, GrpoOptions{}, single_grads, false, 3, 0);
  ASSERT_TRUE(single.ok()) << single.status();
  // 60 tokens a pass: {23, 27}, then {23, 27}; 20: every trajectory alone, packed anyway.
  for (const int64_t pack : {60, 20}) {
    Gradients packed_grads;
    auto packed =
        accumulate_policy_gradient(*model, batch, GrpoOptions{}, packed_grads, false, 3, pack);
    ASSERT_TRUE(packed.ok()) << packed.status();
    expect_same(*packed, *single);
    double worst = 0;
    for (const ParameterArena::Entry& e : model->parameters().entries()) {
      const Tensor* a = single_grads.find(e.name);
      const Tensor* b = packed_grads.find(e.name);
      ASSERT_EQ(a == nullptr, b == nullptr) << e.name;
      if (a == nullptr) continue;
      double num = 0, den = 0;
      for (int64_t i = 0; i < a->numel(); ++i) {
        const double d = double{b->data<float>()[i]} - a->data<float>()[i];
        num += d * d;
        den += double{a->data<float>()[i]} * a->data<float>()[i];
      }
      const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
      worst = std::max(worst, rel);
      // f32 sums of four sequences' terms in another order: ~1e-7 relative; a dropped or doubled
      // sequence moves a tensor's gradient by O(1).
      EXPECT_LE(rel, 1e-5) << e.name << " pack " << pack;
    }
    std::printf("[policy passes] pack %lld tokens: worst gradient rel L2 vs one pass each %.3g\n",
                static_cast<long long>(pack), worst);
  }
}

}  // namespace
}  // namespace loom
