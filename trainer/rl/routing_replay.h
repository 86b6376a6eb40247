// Routing replay in the RL loop (issue 20): what the rollouts record of the engine's MoE routing
// (Trajectory::routed_experts) and how the trainer's forwards replay it
// (engine/model/routing_replay.h).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/routing_replay.h"
#include "engine/request.h"
#include "trainer/rl/trajectory.h"
#include "weights/model_config.h"

namespace loom {

// The RL run's switch (RL.json "routing_replay"). kMeasure and kOn record the engine's routing in
// every rollout; kMeasure counts how often the trainer's own top-k differs, kOn also replays it
// in the trainer's forwards (old logprobs, reference logprobs, the policy loss).
enum class RoutingReplayMode { kOff, kMeasure, kOn };

// Writes the engine's runs (RequestOutput::routed_experts) into tr.routed_experts at their
// positions, growing it with -1 rows as needed (tr.routed_layers and routed_top_k set).
// InvalidArgument for a run whose size is not rows x layers x top_k.
absl::Status add_routed_experts(std::span<const RoutedExperts> runs, Trajectory& tr);

// Sizes every trajectory's record to its tokens, then fills the positions one never routed from
// another trajectory of the same call whose tokens up to and including that position are the
// same and which routed it (the prefix cache served the former from the latter's pages: same
// tokens, same weights). Returns the positions filled so.
int64_t fill_shared_prefix_routing(std::vector<Trajectory>& trajectories);

// The replay of `tr`'s record for a forward over all its tokens: [tokens, top_k] per MoE layer of
// `cfg`, positions never routed -1 (the layer's own top-k). InvalidArgument when the record does
// not match the model's MoE layers or the trajectory's tokens.
absl::StatusOr<RoutingReplay> routing_replay_of(const Trajectory& tr, const ModelConfig& cfg,
                                                bool apply);

// Share of a trajectory's positions (all but the last) with a recorded routing.
double routing_coverage(const Trajectory& tr);

}  // namespace loom
