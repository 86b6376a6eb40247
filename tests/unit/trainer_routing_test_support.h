// Shared by the routing-record tests (engine_routed_experts_test, rl_routing_replay_test): the
// experts the training forward itself picks, to compare the engine's record with.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "engine/model/activation_tape.h"
#include "engine/model/model.h"

namespace loom {

// The training forward's own experts for `tokens` in batch-invariant numerics (the engine's
// deterministic mode): per position, every MoE layer's top-k, in RoutedExperts' layout
// ([positions, moe_layers, top_k]).
inline std::vector<int32_t> trainer_routing(const Model& model,
                                            const std::vector<int32_t>& tokens) {
  const ModelConfig& cfg = model.config();
  SequenceCache cache = model.new_cache();
  ForwardBatch batch;
  batch.token_ids = tokens;
  batch.batch_invariant = true;
  batch.seqs.push_back({.num_tokens = static_cast<int64_t>(tokens.size()),
                        .logits = LogitsMode::kNone,
                        .cache = &cache});
  ActivationTape tape({"expert_ids"});
  EXPECT_TRUE(model.forward(batch, &tape).ok());
  const int64_t k = cfg.moe.top_k;
  std::vector<int32_t> out;
  for (size_t t = 0; t < tokens.size(); ++t)
    for (int l = 0; l < cfg.num_layers; ++l)
      if (cfg.ffns[l] == FfnType::kMoe) {
        const int32_t* row = tape.find(l, "expert_ids")->data<int32_t>() + t * k;
        out.insert(out.end(), row, row + k);
      }
  return out;
}

}  // namespace loom
