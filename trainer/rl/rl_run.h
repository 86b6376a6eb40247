// `loom-trainer rl`: agent RL with GRPO over an RlConfig (trainer/run_config.h). The trainer's
// model (f32, trainable) and the rollout engine's copy of it start from the same weights; each
// step then
//
//   rollout   groups_per_step tasks x group_size episodes through the in-process Engine
//             (run_rollouts), tagged with the engine's weight version
//   score     old logprobs by the trainer's forward (and the reference policy's with a KL term),
//             group rewards and advantages; groups whose rewards are all equal are dropped
//   update    one AdamW step on the token-mean GRPO objective over the kept groups (and replayed
//             ones), through Model::loss_and_gradients with per-token weights
//   sync      Engine::update_weights from the trainer's parameters (the prefix cache is dropped)
//
// and appends one JSON line to RUN/metrics.jsonl. Checkpoints (the native format loom-server
// loads, with the optimizer state) go to RUN/checkpoint-<step> every checkpoint_every steps and at
// the end. An optional warm start first runs supervised steps on the environment's
// demonstrations.
//
// Devices (RL.json "device"): the trainer's model, gradients and AdamW state live on the run's
// device, and the rollout engine runs on the same one (colocated), its matrices in
// "engine.weight_dtype" (f32, or bf16 rounded from the trainer's f32 at every sync). Everything
// else (environments, rewards, advantages, the replay buffer, the logprobs) is on the host. Routing
// replay runs on either device (on a GPU its records are uploaded layer by layer).
#pragma once

#include <cstdio>
#include <string>

#include "absl/status/statusor.h"
#include "trainer/run_config.h"

namespace loom {

struct RlRunSummary {
  int64_t steps = 0;                         // RL steps run
  double first_reward = 0, last_reward = 0;  // mean task reward of the first and last step
  // Mean task reward over the first and the last third of the steps (at least one step each):
  // one step's mean over a few groups is noisy.
  double first_reward_mean = 0, last_reward_mean = 0;
  double warm_start_loss = 0;  // the last warm-start step's loss (0 without one)
  double initial_sync_s = 0;   // the first weight sync (the starting weights into the engine)
  bool stopped_by_time_limit = false;  // RL.json time_limit_s ended the run before `steps`
  std::string last_checkpoint;
};

// `progress`: where a line per step goes (stderr for the tool, null for none).
absl::StatusOr<RlRunSummary> run_rl(const RlConfig& config, std::FILE* progress);

}  // namespace loom
