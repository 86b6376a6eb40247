// The trainer's side of a GRPO step over the model: per-token logprobs of a sequence (a forward
// without a backward), and the policy objective's gradient accumulated through
// Model::loss_and_gradients with per-token weights: the objective's derivative with respect to
// each response token's logprob (grpo.h), which the fused cross-entropy's weighted form turns
// into the parameters' gradients (row_loss = -logp, so the row weight is -d_logp / N).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/gradients.h"
#include "engine/model/model.h"
#include "engine/model/routing_replay.h"
#include "trainer/rl/grpo.h"
#include "trainer/rl/trajectory.h"

namespace loom {

// logp[i] = log p(tokens[i + 1] | tokens[0..i]) for every i < n - 1 (logp[n - 1] = 0), from a
// fresh state, with the model's training forward (f32, on the model's device; the logprobs come
// back to the host). InvalidArgument for fewer than 2 tokens or an id outside the vocabulary.
// With `routing_replay` (routing_replay.h, its tensors on the host whatever the model's device)
// the MoE layers route as it says, and its counters are added to.
absl::StatusOr<std::vector<float>> token_logprobs(const Model& model,
                                                  std::span<const int32_t> tokens,
                                                  RoutingReplay* routing_replay = nullptr);

struct PolicyLossStats {
  int64_t tokens = 0;        // response tokens N (the token mean's denominator)
  double loss = 0;           // the objective L
  double clip_fraction = 0;  // share of tokens whose clipped branch was active
  double entropy = 0;     // mean -logp of the sampled tokens: an estimate of the policy's entropy
  double kl = 0;          // mean k3 (0 without a KL term)
  double tis_mean = 0;    // mean truncated importance weight (1 when off)
  double mismatch = 0;    // mean |old_logp - behav_logp|: the engine/trainer logprob gap
  double ratio_mean = 0;  // mean importance ratio to the rollout-time policy
};

// Adds the gradient of the token-mean GRPO objective over `batch` (each trajectory's advantage,
// old_logp and behav_logp set; ref_logp with a KL term) into `grads`. Trajectories whose
// advantage is 0 and which carry no KL term add nothing and are skipped. With `replay_routing`
// every trajectory's forward and backward route its tokens to the experts the engine recorded
// (Trajectory::routed_experts; InvalidArgument when one has none).
// `scored_version` (>= 0): the weight version the model's parameters still hold since they
// scored old_logp (the RL loop's: no update between scoring and this call). A trajectory sampled
// under it reuses its old_logp as the current logprobs, which the same forward would give again
// bit for bit, instead of running that forward; -1: every trajectory's forward runs.
// `pack_tokens`: the trajectories' forward and backward passes run packed, several per
// Model::loss_and_gradients_packed call of at most this many tokens (a longer trajectory alone),
// which is what keeps a GPU busy; the gradient is the per-trajectory calls' up to f32 summation
// order. 0: one loss_and_gradients call per trajectory (and always with `replay_routing`). -1:
// kPolicyPackTokens on a GPU, 0 on the CPU (whose per-trajectory results the demonstrations
// were measured with).
inline constexpr int64_t kPolicyPackTokens = 16384;
absl::StatusOr<PolicyLossStats> accumulate_policy_gradient(
    const Model& model, std::span<const Trajectory* const> batch, const GrpoOptions& options,
    Gradients& grads, bool replay_routing = false, int64_t scored_version = -1,
    int64_t pack_tokens = -1);

}  // namespace loom
