// GRPO's arithmetic (issue 20), as pure functions over rewards and per-token logprobs: the
// group-normalised advantages, the all-equal group filter, the over-length penalty, and each
// token's term of the clipped importance-ratio objective with the truncated importance-sampling
// correction and the k3 KL estimate, together with its derivative with respect to the token's
// current logprob (what the model's weighted backward takes; trainer/rl/policy_loss.h).
//
// The objective minimised over a batch of trajectories (token-mean: every response token of the
// batch counts once, whatever its trajectory's length, as DAPO does):
//   L = (1 / N) sum_t [ tis_t * -min(r_t A, clip(r_t, 1 - clip_low, 1 + clip_high) A)
//                       + kl_coef * k3_t ]
//   r_t   = exp(logp_t - old_t)              the ratio to the policy the trajectory was scored
//   under tis_t = min(exp(old_t - behav_t), tis_cap)  the engine/trainer mismatch (no gradient; 1
//   when off) k3_t  = exp(ref_t - logp_t) - (ref_t - logp_t) - 1   (Schulman's k3 estimate of KL(pi
//   || ref))
// where logp is the trainer's logprob now, old the trainer's at the rollout's weights, behav the
// engine's (the sampler's) and ref the reference policy's.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "trainer/rl/trajectory.h"

namespace loom {

struct GrpoOptions {
  bool scale_by_std = true;  // advantages (r - mean) / (std + eps); false: r - mean (Dr. GRPO)
  double std_eps = 1e-6;
  double clip_low = 0.2, clip_high = 0.28;  // the ratio's range [1 - low, 1 + high] (DAPO)
  double kl_coef = 0;                       // 0: no KL term (and no reference policy needed)
  double tis_cap = 2.0;                     // 0: no truncated importance sampling
  bool drop_equal_reward_groups = true;     // groups whose rewards are all equal teach nothing
  // DAPO's soft over-length penalty on a trajectory's response tokens L (0 when max_len is 0):
  // 0 for L <= max_len - buffer, -penalty * (L - (max_len - buffer)) / buffer up to max_len, and
  // -penalty beyond it.
  int64_t overlong_max_len = 0, overlong_buffer = 0;
  double overlong_penalty = 1.0;

  // InvalidArgument naming the field.
  absl::Status validate() const;
};

// Per trajectory of one group: (r_i - mean) / (std + eps) with the population std, or r_i - mean.
std::vector<double> group_advantages(std::span<const double> rewards, const GrpoOptions& options);

// Whether every reward of the group equals the first (an empty group counts as equal).
bool rewards_all_equal(std::span<const double> rewards);

// The over-length penalty (<= 0) of a response of `length` tokens.
double overlong_penalty(int64_t length, const GrpoOptions& options);

// Scores one group in place: each member's reward = task_reward + overlong_penalty(its response
// tokens), then its advantage from the group's rewards. Returns false, with every advantage 0,
// when the group is dropped (drop_equal_reward_groups and all rewards equal: no signal).
bool score_group(TrajectoryGroup& group, const GrpoOptions& options);

// One response token's inputs and what its term gives.
struct TokenInputs {
  double logp = 0, old_logp = 0, behav_logp = 0, ref_logp = 0;
  double advantage = 0;
};
struct TokenTerm {
  double loss = 0;       // the token's term before the 1 / N
  double d_logp = 0;     // its derivative with respect to logp
  bool clipped = false;  // the clipped branch is the active one (no policy gradient)
  double ratio = 1, tis = 1, kl = 0;
};
TokenTerm grpo_token_term(const TokenInputs& in, const GrpoOptions& options);

}  // namespace loom
