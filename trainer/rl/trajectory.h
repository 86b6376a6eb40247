// One sampled episode as the trainer sees it: the token sequence the engine was given and sampled
// (prompts, the model's turns, the environment's tool results, in the chat template's layout),
// which of its tokens the model sampled, with what logprob, and what it earned; and the groups
// GRPO compares (one task, G episodes).
#pragma once

#include <cstdint>
#include <vector>

namespace loom {

struct Trajectory {
  // The whole conversation as tokens. Position i with sampled[i] = 1 is where the model sampled
  // tokens[i + 1] (the loss-mask convention of trainer/synthetic_tasks.h): the last entry is 0.
  std::vector<int32_t> tokens;
  std::vector<uint8_t> sampled;
  // Per position (0 where not sampled): the engine's logprob of tokens[i + 1] when it sampled it
  // (the behaviour policy), the trainer's at the weights of the rollout (filled by the trainer)
  // and the reference policy's (only with a KL term).
  std::vector<float> behav_logp, old_logp, ref_logp;
  double task_reward = 0;  // the environment's reward
  double reward = 0;       // task_reward plus the over-length penalty
  double advantage = 0;
  int64_t response_tokens = 0;  // tokens the model sampled (over every turn)
  int turns = 0;                // model turns
  bool answered = false;        // ended with a final answer (a turn without a tool call)
  bool truncated = false;       // stopped by a budget (turn tokens, turns, trajectory tokens)
  bool malformed = false;       // ended by an unrenderable tool call (no name, arguments not JSON)
  int64_t version = 0;          // the weight version it was sampled under
  // Routing replay (RolloutOptions::record_routing): the experts the engine routed each position
  // to, [tokens.size(), routed_layers, routed_top_k] (the model's MoE layers in order); a position
  // it never routed for this episode (the last token; context after the last turn) is all -1.
  // Empty when not recorded.
  std::vector<int32_t> routed_experts;
  int routed_layers = 0, routed_top_k = 0;
};

struct TrajectoryGroup {
  uint64_t task_seed = 0;  // the environment episode every member started from
  int64_t version = 0;
  std::vector<Trajectory> members;
};

}  // namespace loom
