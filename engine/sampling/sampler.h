// Sampler: one request's logits -> one token, with penalties, filters, a per-request random stream
// and logprobs. Pure host code over f32 logits; the engine calls it per sequence per step.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "engine/sampling/sampling_params.h"

namespace loom {

struct SampledToken {
  int32_t token = -1;
  float logprob = 0.0f;                                 // log-softmax of the raw logits at `token`
  std::vector<std::pair<int32_t, float>> top_logprobs;  // raw top-k, descending
};

// What the presence and frequency penalties subtract from a token generated `count` times: the one
// formula (and rounding) both the host sampler and the batched GPU sampler use.
float presence_frequency_penalty(const SamplingParams& params, int32_t count);

// Per-request sampling state: the random stream and output-token counts for penalties. Owned by the
// engine loop thread with its request; not thread-safe.
class SamplerState {
 public:
  // `seed` seeds the stream (the engine draws one when the request has none). `prompt` feeds the
  // repetition penalty.
  SamplerState(uint64_t seed, std::span<const int32_t> prompt);

  // Samples from `logits` (vocab entries, modified in place as scratch). `eos_ids` are masked
  // while fewer than min_tokens tokens were generated. Records the chosen token as output.
  SampledToken sample(std::span<float> logits, const SamplingParams& params,
                      std::span<const int32_t> eos_ids);

  int num_generated() const { return num_generated_; }

  // The pieces of sample() that the batched GPU sampler (engine/sampling/batch_sampler.cc) runs
  // around its kernel, so that a request's stream is the same on both: the one uniform draw in
  // [0, 1) that sample() makes per token (greedy or not, whatever the filters), the token sets
  // its penalties read, and the update it makes once a token is chosen.
  double next_uniform();
  const absl::flat_hash_map<int32_t, bool>& prompt_tokens() const { return prompt_tokens_; }
  const absl::flat_hash_map<int32_t, int32_t>& output_counts() const { return output_counts_; }
  void record(int32_t token);

 private:
  std::mt19937_64 rng_;
  absl::flat_hash_map<int32_t, int32_t> output_counts_;
  absl::flat_hash_map<int32_t, bool> prompt_tokens_;
  int num_generated_ = 0;
};

}  // namespace loom
