// Shared by the routing-replay tests (routing_replay_test on the CPU, rl_routing_replay_cuda_test
// on the GPU): drawing replayed experts and counting the slots that leave a router's choice.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "core/tensor.h"
#include "weights/model_config.h"

namespace loom {

// k distinct experts of e, drawn uniformly.
inline std::vector<int32_t> pick_experts(std::mt19937& rng, int64_t e, int64_t k) {
  std::vector<int32_t> all(static_cast<size_t>(e));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  return std::vector<int32_t>(all.begin(), all.begin() + k);
}

// Slots of `replayed` (rows whose first entry is >= 0) whose expert is not among `own`'s row (both
// [T, K] i32 on the host).
inline int64_t differing_slots(const Tensor& own, const Tensor& replayed) {
  const int64_t t = own.dim(0), k = own.dim(1);
  int64_t n = 0;
  for (int64_t i = 0; i < t; ++i) {
    const int32_t* r = replayed.data<int32_t>() + i * k;
    const int32_t* o = own.data<int32_t>() + i * k;
    if (r[0] < 0) continue;
    for (int64_t j = 0; j < k; ++j) n += std::find(o, o + k, r[j]) == o + k;
  }
  return n;
}

// The model's MoE layers, in order.
inline std::vector<int> moe_layers(const ModelConfig& cfg) {
  std::vector<int> out;
  for (int l = 0; l < cfg.num_layers; ++l)
    if (cfg.ffns[l] == FfnType::kMoe) out.push_back(l);
  return out;
}

}  // namespace loom
