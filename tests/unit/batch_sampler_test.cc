// BatchSampler on the host is SamplerState::sample row by row (the reference the GPU sampler is
// held to), and the pieces of sample() the GPU path runs around its kernel (next_uniform, record,
// presence_frequency_penalty) keep a request's stream and counts where sample() keeps them.
#include "engine/sampling/batch_sampler.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace loom {
namespace {

std::vector<float> random_logits(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::vector<float> l(static_cast<size_t>(n));
  for (float& x : l) x = d(rng);
  return l;
}

TEST(BatchSampler, HostRowsAreSamplerStateSample) {
  const int64_t vocab = 257, rows = 5;
  const std::vector<float> logits = random_logits(rows * vocab, 3);
  std::vector<SamplingParams> params(rows);
  params[0].temperature = 0;
  params[1].temperature = 0.7f;
  params[1].top_k = 40;
  params[1].logprobs = 3;
  params[2].temperature = 1.3f;
  params[2].top_p = 0.9f;
  params[2].min_p = 0.1f;
  params[2].repetition_penalty = 1.2f;
  params[2].presence_penalty = 0.5f;
  params[2].frequency_penalty = 0.25f;
  params[2].logit_bias = {{7, 3.0f}, {9, -2.0f}, {7, 1.5f}};
  params[4].min_tokens = 3;
  params[4].stop_token_ids = {11};
  const std::vector<int32_t> prompt = {1, 2, 3, 7};
  const std::vector<int32_t> eos = {5};
  std::vector<SamplerState> batch_states, ref_states;
  for (int64_t i = 0; i < rows; ++i) {
    batch_states.emplace_back(100 + i, prompt);
    ref_states.emplace_back(100 + i, prompt);
  }
  BatchSampler sampler(Device::kCpu);
  for (int step = 0; step < 4; ++step) {
    Tensor t = Tensor::empty({rows, vocab});
    std::copy(logits.begin(), logits.end(), t.data<float>());
    for (int64_t i = 0; i < rows * vocab; ++i) t.data<float>()[i] += 0.01f * step;
    std::vector<SampleSlot> slots(rows);
    for (int64_t i = 0; i < rows; ++i)
      if (i != 3) slots[i] = {.state = &batch_states[i], .params = &params[i], .eos_ids = eos};
    std::vector<float> copy(t.data<float>(), t.data<float>() + rows * vocab);
    const std::vector<SampledToken>& got = sampler.sample(t, slots);
    ASSERT_EQ(got.size(), static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) {
      if (i == 3) {
        EXPECT_EQ(got[i].token, -1) << "a row without a state is not sampled";
        continue;
      }
      std::span<float> row(copy.data() + i * vocab, vocab);
      const SampledToken want = ref_states[i].sample(row, params[i], eos);
      EXPECT_EQ(got[i].token, want.token) << "step " << step << " row " << i;
      EXPECT_EQ(got[i].logprob, want.logprob);
      EXPECT_EQ(got[i].top_logprobs, want.top_logprobs);
    }
  }
}

// sample() = next_uniform() once + record(token): a state driven by the pieces draws the same
// stream and keeps the same counts as one driven by sample().
TEST(BatchSampler, PiecesKeepTheStreamOfSample) {
  SamplingParams p;
  p.temperature = 0.9f;
  p.presence_penalty = 0.3f;
  p.frequency_penalty = 0.7f;
  SamplerState whole(42, {}), pieces(42, {});
  std::vector<float> l = random_logits(64, 9);
  for (int i = 0; i < 5; ++i) {
    std::vector<float> scratch = l;
    const int32_t t = whole.sample(scratch, p, {}).token;
    pieces.next_uniform();
    pieces.record(t);
  }
  EXPECT_EQ(whole.num_generated(), pieces.num_generated());
  EXPECT_EQ(whole.output_counts(), pieces.output_counts());
  EXPECT_EQ(whole.next_uniform(), pieces.next_uniform());
  EXPECT_FLOAT_EQ(presence_frequency_penalty(p, 3), 0.3f + 0.7f * 3.0f);
}

}  // namespace
}  // namespace loom
