// Sampler: each filter and penalty against a direct computation, the random stream's
// reproducibility, and the empirical distribution against softmax(logits / T).
#include "engine/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace loom {
namespace {

std::vector<double> softmax(const std::vector<float>& l, double t) {
  double mx = *std::max_element(l.begin(), l.end()), z = 0;
  std::vector<double> p(l.size());
  for (size_t i = 0; i < l.size(); ++i) z += p[i] = std::exp((l[i] - mx) / t);
  for (double& q : p) q /= z;
  return p;
}

std::vector<float> random_logits(int v, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::vector<float> l(v);
  for (float& x : l) x = d(rng);
  return l;
}

// Counts of `draws` samples with fresh logits copies each time.
std::map<int32_t, int> histogram(const std::vector<float>& logits, const SamplingParams& p,
                                 int draws, uint64_t seed) {
  SamplerState s(seed, {});
  std::map<int32_t, int> h;
  SamplingParams q = p;
  q.presence_penalty = q.frequency_penalty = 0;
  for (int i = 0; i < draws; ++i) {
    std::vector<float> l = logits;
    SamplerState fresh(seed + i, {});
    ++h[fresh.sample(l, q, {}).token];
  }
  return h;
}

// Each token's count within 5 binomial standard deviations (+1) of draws * expect[t].
void expect_counts_match(std::map<int32_t, int>& h, const std::vector<double>& expect, int draws) {
  for (size_t t = 0; t < expect.size(); ++t) {
    const double mean = expect[t] * draws, sd = std::sqrt(draws * expect[t] * (1 - expect[t]));
    EXPECT_NEAR(h[static_cast<int32_t>(t)], mean, 5 * sd + 1) << "token " << t;
  }
}

TEST(Sampler, GreedyIsArgmaxLowestIdOnTies) {
  SamplerState s(1, {});
  SamplingParams p;
  p.temperature = 0;
  std::vector<float> l = {0.5f, 3.0f, -1.0f, 3.0f};
  EXPECT_EQ(s.sample(l, p, {}).token, 1);
}

TEST(Sampler, TemperatureMatchesSoftmax) {
  const std::vector<float> logits = random_logits(7, 3);
  SamplingParams p;
  p.temperature = 0.7f;
  const int draws = 60000;
  auto h = histogram(logits, p, draws, 11);
  expect_counts_match(h, softmax(logits, 0.7), draws);
}

TEST(Sampler, TopKTopPMinPKeepOnlyTheirSets) {
  const std::vector<float> logits = random_logits(50, 5);
  const std::vector<double> prob = softmax(logits, 1.0);
  std::vector<int> order(50);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  {
    SamplingParams p;
    p.top_k = 5;
    for (const auto& [t, c] : histogram(logits, p, 3000, 1))
      EXPECT_LT(std::find(order.begin(), order.end(), t) - order.begin(), 5) << t;
  }
  {
    SamplingParams p;
    p.top_p = 0.6f;
    int nucleus = 0;
    for (double cum = 0; cum < 0.6; ++nucleus) cum += prob[order[nucleus]];
    for (const auto& [t, c] : histogram(logits, p, 3000, 2))
      EXPECT_LT(std::find(order.begin(), order.end(), t) - order.begin(), nucleus) << t;
  }
  {
    SamplingParams p;
    p.min_p = 0.3f;
    for (const auto& [t, c] : histogram(logits, p, 3000, 3))
      EXPECT_GE(prob[t], 0.3 * prob[order[0]] * (1 - 1e-6)) << t;
  }
}

// The truncated, renormalised distribution each filter promises, computed directly: softmax at
// temperature t, then top-k (the k largest), top-p (the smallest prefix by probability whose mass
// reaches p, boundary token included), min-p (tokens at least min_p times the most likely).
std::vector<double> truncated(const std::vector<float>& l, double t, int top_k, double top_p,
                              double min_p) {
  std::vector<double> p = softmax(l, t);
  std::vector<int> order(l.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
  size_t keep = top_k > 0 ? std::min<size_t>(top_k, l.size()) : l.size();
  double mass = 0;
  for (size_t i = 0; i < keep; ++i) mass += p[order[i]];
  double cum = 0;
  for (size_t i = 0; i < keep; ++i) {
    cum += p[order[i]] / mass;
    if (cum >= top_p) {
      keep = i + 1;
      break;
    }
  }
  size_t min_keep = 1;
  while (min_keep < keep && p[order[min_keep]] >= min_p * p[order[0]]) ++min_keep;
  keep = std::min(keep, min_keep);
  std::vector<double> out(l.size(), 0.0);
  double z = 0;
  for (size_t i = 0; i < keep; ++i) z += p[order[i]];
  for (size_t i = 0; i < keep; ++i) out[order[i]] = p[order[i]] / z;
  return out;
}

// Each filter's boundary carries real mass here (checked below), so keeping one token too few or
// too many, or a stricter threshold, moves the counts far outside the binomial band.
TEST(Sampler, FiltersMatchTheTruncatedRenormalisedSoftmax) {
  // Probabilities at T = 0.8 of these logits: about .38 .24 .15 .096 .061 .039 .025 ...
  const std::vector<float> logits = {2.0f, 1.64f, 1.26f, 0.9f, 0.54f, 0.18f, -0.18f, -0.6f};
  const double t = 0.8;
  struct Case {
    int top_k;
    double top_p, min_p;
  };
  const Case cases[] = {
      {4, 1.0, 0.0},   // top-k: the 4th token (~10%) kept, the 5th dropped
      {0, 0.7, 0.0},   // top-p: .38 + .24 < .7, so the boundary token (~15%) is kept
      {0, 1.0, 0.15},  // min-p: 0.061 / 0.38 = 0.16 >= 0.15 kept; 0.039 / 0.38 dropped
      {6, 0.9, 0.1},   // all three, in the engine's order
      {0, 1.0, 0.0},   // nothing
  };
  int seed = 100;
  for (const Case& c : cases) {
    SamplingParams p;
    p.temperature = static_cast<float>(t);
    p.top_k = c.top_k;
    p.top_p = static_cast<float>(c.top_p);
    p.min_p = static_cast<float>(c.min_p);
    const std::vector<double> expect = truncated(logits, t, c.top_k, c.top_p, c.min_p);
    // The last kept token must be likely enough that dropping it shows.
    double smallest_kept = 1;
    for (double q : expect)
      if (q > 0) smallest_kept = std::min(smallest_kept, q);
    if (c.top_k > 0 || c.top_p < 1 || c.min_p > 0)
      ASSERT_GT(smallest_kept, 0.03) << "case top_k=" << c.top_k << " top_p=" << c.top_p;
    const int draws = 40000;
    auto h = histogram(logits, p, draws, seed += 1000);
    SCOPED_TRACE(::testing::Message()
                 << "top_k=" << c.top_k << " top_p=" << c.top_p << " min_p=" << c.min_p);
    expect_counts_match(h, expect, draws);
  }
}

TEST(Sampler, PenaltiesShiftTheArgmax) {
  SamplingParams p;
  p.temperature = 0;
  // Repetition penalty 2 halves the prompt token's positive logit: 3 -> 1.5 < 2.
  {
    std::vector<int32_t> prompt = {0};
    SamplerState s(1, prompt);
    p.repetition_penalty = 2.0f;
    std::vector<float> l = {3.0f, 2.0f, -5.0f};
    EXPECT_EQ(s.sample(l, p, {}).token, 1);
    EXPECT_FLOAT_EQ(l[0], 1.5f);
  }
  // Frequency penalty grows with each repeat of the output token.
  {
    SamplerState s(1, {});
    p.repetition_penalty = 1.0f;
    p.frequency_penalty = 0.4f;
    std::vector<int32_t> got;
    for (int i = 0; i < 4; ++i) {
      std::vector<float> l = {1.0f, 0.5f};
      got.push_back(s.sample(l, p, {}).token);
    }
    // token 0 wins until 1.0 - 0.4 * count < 0.5, i.e. after two picks; then they alternate.
    EXPECT_EQ(got, (std::vector<int32_t>{0, 0, 1, 0}));
  }
}

TEST(Sampler, MinTokensMasksEos) {
  SamplingParams p;
  p.temperature = 0;
  p.min_tokens = 2;
  SamplerState s(1, {});
  const int32_t eos[] = {2};
  std::vector<float> l = {0.0f, 1.0f, 9.0f};
  EXPECT_EQ(s.sample(l, p, eos).token, 1);
  l = {0.0f, 1.0f, 9.0f};
  EXPECT_EQ(s.sample(l, p, eos).token, 1);
  l = {0.0f, 1.0f, 9.0f};
  EXPECT_EQ(s.sample(l, p, eos).token, 2);
}

TEST(Sampler, SameSeedSameStream) {
  const std::vector<float> logits = random_logits(100, 9);
  SamplingParams p;
  p.temperature = 1.3f;
  p.top_p = 0.9f;
  SamplerState a(42, {}), b(42, {}), c(43, {});
  std::vector<int32_t> ta, tb, tc;
  for (int i = 0; i < 50; ++i) {
    std::vector<float> l1 = logits, l2 = logits, l3 = logits;
    ta.push_back(a.sample(l1, p, {}).token);
    tb.push_back(b.sample(l2, p, {}).token);
    tc.push_back(c.sample(l3, p, {}).token);
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
}

TEST(Sampler, LogprobsAreRawLogSoftmax) {
  const std::vector<float> logits = random_logits(30, 4);
  SamplingParams p;
  p.temperature = 0.5f;
  p.logprobs = 3;
  p.repetition_penalty = 1.5f;  // logprobs ignore processing
  std::vector<int32_t> prompt = {1, 2};
  SamplerState s(7, prompt);
  std::vector<float> l = logits;
  SampledToken t = s.sample(l, p, {});
  const std::vector<double> prob = softmax(logits, 1.0);
  EXPECT_NEAR(t.logprob, std::log(prob[t.token]), 1e-5);
  ASSERT_EQ(t.top_logprobs.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(t.top_logprobs[i].second, std::log(prob[t.top_logprobs[i].first]), 1e-5);
    if (i) {
      EXPECT_GE(t.top_logprobs[i - 1].second, t.top_logprobs[i].second);
    }
  }
  EXPECT_EQ(t.top_logprobs[0].first,
            std::max_element(logits.begin(), logits.end()) - logits.begin());
}

TEST(Sampler, LogitBiasShiftsTheDistributionAndBans) {
  const std::vector<float> logits = random_logits(9, 21);
  SamplingParams p;
  p.temperature = 0.8f;
  p.logit_bias = {{2, 1.5f}, {5, -100.0f}, {7, -0.75f}};
  std::vector<float> biased = logits;
  for (const auto& [t, b] : p.logit_bias) biased[t] += b;
  const int draws = 60000;
  auto h = histogram(logits, p, draws, 31);
  expect_counts_match(h, softmax(biased, 0.8), draws);
  EXPECT_EQ(h[5], 0);  // -100 bans the token in practice
  // Greedy follows the biased argmax; logprobs stay those of the raw logits.
  SamplingParams g;
  g.temperature = 0;
  g.logprobs = 0;
  const int32_t raw_argmax =
      static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  const int32_t other = raw_argmax == 0 ? 1 : 0;
  g.logit_bias = {{raw_argmax, -100.0f}, {other, 100.0f}};
  std::vector<float> l = logits;
  SamplerState s(1, {});
  SampledToken tok = s.sample(l, g, {});
  EXPECT_EQ(tok.token, other);
  const std::vector<double> raw = softmax(logits, 1.0);
  EXPECT_NEAR(tok.logprob, std::log(raw[other]), 1e-4);
}

TEST(SamplingParams, Validate) {
  SamplingParams ok;
  EXPECT_TRUE(ok.validate(100).ok());
  auto bad = [](auto edit) {
    SamplingParams p;
    edit(p);
    return !p.validate(100).ok();
  };
  EXPECT_TRUE(bad([](auto& p) { p.temperature = -1; }));
  EXPECT_TRUE(bad([](auto& p) { p.temperature = 2.5f; }));  // OpenAI's range, on every frontend
  EXPECT_FALSE(bad([](auto& p) { p.temperature = 2.0f; }));
  EXPECT_TRUE(bad([](auto& p) { p.top_p = 0; }));
  EXPECT_TRUE(bad([](auto& p) { p.top_k = -2; }));
  EXPECT_TRUE(bad([](auto& p) { p.max_tokens = 0; }));
  EXPECT_TRUE(bad([](auto& p) { p.min_tokens = 50; }));
  EXPECT_TRUE(bad([](auto& p) { p.logprobs = 21; }));
  EXPECT_TRUE(bad([](auto& p) { p.n = 0; }));
  EXPECT_TRUE(bad([](auto& p) { p.stop_token_ids = {100}; }));
  EXPECT_TRUE(bad([](auto& p) { p.stop = {""}; }));
  EXPECT_TRUE(bad([](auto& p) { p.presence_penalty = 3; }));
  EXPECT_TRUE(bad([](auto& p) { p.temperature = NAN; }));
  EXPECT_TRUE(bad([](auto& p) { p.logit_bias = {{100, 1.0f}}; }));
  EXPECT_TRUE(bad([](auto& p) { p.logit_bias = {{-1, 1.0f}}; }));
  EXPECT_TRUE(bad([](auto& p) { p.logit_bias = {{3, 100.5f}}; }));
  EXPECT_TRUE(bad([](auto& p) { p.logit_bias = {{3, NAN}}; }));
  EXPECT_FALSE(bad([](auto& p) { p.logit_bias = {{99, -100.0f}, {0, 100.0f}}; }));
}

}  // namespace
}  // namespace loom
