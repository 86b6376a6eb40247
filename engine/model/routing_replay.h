// RoutingReplay: the experts each MoE layer routes the rows of a forward to, given rather than
// chosen (routing replay for MoE RL, issue 20). The engine records the experts it routed a
// rollout's tokens to (Request::return_routed_experts); the trainer's forward for the policy loss
// replays them, so that the logprobs it differentiates come from the experts that produced the
// sampled tokens (engine and trainer routers disagree on a few percent of choices otherwise, and
// that has collapsed MoE RL runs elsewhere). The gate weights are still the trainer's router's
// (moe_route_replay), so its gradient flows through them; the selection bias gets none.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/tensor.h"
#include "weights/model_config.h"

namespace loom {

struct RoutingReplay {
  // By layer: config().num_layers entries, undefined for a dense layer (and allowed undefined for
  // an MoE layer, which then routes by its own top-k). An MoE layer's: [N, top_k] i32 on the CPU,
  // row t the experts of the batch's row t in slot order (the order the router chose them, which
  // fixes the sum order of the renormalisation); a row whose first entry is -1 routes by the
  // layer's own top-k (a token the engine never forwarded, such as a rollout's last).
  std::vector<Tensor> expert_ids;
  // false: measure only. The layers count the replayed slots that differ from their own top-k but
  // route by their own (what a run without replay would do, with its disagreement measured).
  bool apply = true;

  // Written by the forward (not by a backward's recomputation), added to: slots (row, layer,
  // choice) replayed, and those whose expert is not among the layer's own top-k for the row.
  int64_t replayed_slots = 0;
  int64_t differing_slots = 0;
};

// InvalidArgument unless `replay` fits a forward of `rows` rows of a model with `cfg`: one entry
// per layer, dense layers undefined, MoE layers undefined or [rows, top_k] i32 on the CPU with
// each row either -1 in its first entry or top_k distinct experts in [0, num_experts).
absl::Status validate_routing_replay(const ModelConfig& cfg, const RoutingReplay& replay,
                                     int64_t rows);

}  // namespace loom
