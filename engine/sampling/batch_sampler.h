// BatchSampler: one step's logits rows -> one token per row, wherever the logits are. On the host
// it calls SamplerState::sample row by row (the reference); on a GPU it runs the batched sampler
// (kernels/cuda/sampling.h) over the device logits, so that only the chosen ids and the requested
// logprobs cross to the host, with each row's uniform draw taken from its own SamplerState as
// sample() takes it: a seeded request draws the same tokens on both.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "engine/sampling/sampler.h"
#include "engine/sampling/sampling_params.h"

namespace loom {

// One logits row of the step.
struct SampleSlot {
  SamplerState* state = nullptr;  // null: the row is not sampled (its SampledToken stays -1)
  const SamplingParams* params = nullptr;
  std::span<const int32_t> eos_ids;  // masked while fewer than min_tokens were generated
};

// Owned by the engine loop thread; not thread-safe.
class BatchSampler {
 public:
  // `device`: where the step's logits live (the model's device).
  explicit BatchSampler(Device device);
  ~BatchSampler();
  BatchSampler(const BatchSampler&) = delete;
  BatchSampler& operator=(const BatchSampler&) = delete;

  // Samples row i of `logits` [k, V] (f32, contiguous, on the sampler's device; used as scratch:
  // the rows are modified) for slots[i], records the token in its SamplerState, and returns one
  // SampledToken per row, valid until the next call. On a GPU the call returns once the tokens
  // are on the host. The device scratch is kept between calls and grows only for a larger step.
  const std::vector<SampledToken>& sample(const Tensor& logits, std::span<const SampleSlot> slots);

  // Allocates now the device scratch the largest step needs (`max_rows` rows of `vocab` logits,
  // every one sampled with top-p and logprobs: the sort's worst case), so that serving never grows
  // it and a device memory budget can count it. Returns the scratch's bytes (0 on the host).
  size_t reserve(int32_t max_rows, int64_t vocab);

  // Tests: fill the device scratch (the kernels' outputs included) with 0xff bytes before each
  // GPU call, so that a result the kernels fail to write shows up as a -1 token or a NaN.
  void TEST_poison_scratch(bool on) { poison_ = on; }

 private:
  struct Gpu;
  const Device device_;
  std::vector<SampledToken> out_;
  std::unique_ptr<Gpu> gpu_;  // the packed batch and device scratch (GPU devices only)
  bool poison_ = false;
};

}  // namespace loom
