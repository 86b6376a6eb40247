// The run config of `loom-trainer train --config RUN.json` (every field in docs/trainer.md).
// Unknown fields and values of the wrong type are errors naming the field: nothing is ignored.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/rl/environment.h"
#include "trainer/rl/grpo.h"
#include "trainer/rl/rollout.h"
#include "trainer/rl/routing_replay.h"
#include "trainer/stages.h"
#include "trainer/synthetic_tasks.h"
#include "trainer/tool_dialogues.h"
#include "trainer/train_step.h"
#include "weights/parameter_arena.h"

namespace loom {

// One task of a mix (data.task "mix"): each example's task is drawn in proportion to the weights.
struct TaskWeight {
  std::string task;  // "mqar", "passkey" or "tool_dialogue"
  double weight = 1;
};

struct RunConfig {
  // The model: a fresh one from a config with deterministic random weights, or a checkpoint
  // (a trainer checkpoint resumes its optimizer state and data position too).
  std::string model_config;  // "model": {"config": PATH, "seed": N}
  uint64_t model_seed = 1;
  std::string model_checkpoint;  // "model": {"checkpoint": DIR}
  // The data: a synthetic task, a mix of them, or token shards cut into sequences of seq_len.
  std::string task;  // "mqar", "passkey", "tool_dialogue", "mix" or "shards"
  MqarOptions mqar;
  // tool_dialogue and passkey: their options and the tokenizer that encodes them ("byte", a folder
  // or a tokenizer.json; empty: the model folder's tokenizer, else the byte-level one).
  ToolDialogueOptions tool_dialogue;
  PasskeyTrainOptions passkey;
  std::string tokenizer;
  std::vector<TaskWeight> mix;  // task "mix": at least one task, each at most once
  // data.loss: "answers" (false: each task's answers, its loss mask) or "all" (true: every
  // next-token prediction of a synthetic example; shards always score every token).
  bool score_all_tokens = false;
  std::vector<std::string> shards;
  int seq_len = 256;
  int batch_size = 8;
  int64_t steps = 100;  // optimizer steps to run (the LR schedule's total_steps by default)
  // "balance" and "routing_warnings" land in optimizer.balance, optimizer.balancer and
  // optimizer.aux_loss_alpha; "max_tokens_per_pass" in optimizer.max_tokens_per_pass.
  OptimizerOptions optimizer;
  // Staged context extension (stages.h): empty for a single-length run. With stages, steps
  // defaults to the sum of their max_steps and caps the run.
  std::vector<StageConfig> stages;
  StabilityRule stage_stability;  // "stage_stability": {"window", "tolerance"}
  int64_t loss_bucket = 256;      // width of loss_by_position's first bucket (then doubling)
  std::string out;                // run folder: metrics.jsonl, checkpoint-N/
  int64_t checkpoint_every = 0;   // 0: only at the end
  uint64_t seed = 0;              // data order and synthetic examples
  // Where the model, its gradients and the optimizer state live ("device": "cpu", "cuda" or
  // "cuda:N"); whether this build and machine have it is checked when the model loads.
  Device device = Device::kCpu;
  // "matmul": "f32" (default), "tf32" or "bf16": the GPU's f32 GEMMs on TF32 or bf16 tensor
  // cores (Model::set_matmul_precision); CUDA devices only.
  MatmulPrecision matmul = MatmulPrecision::kF32;
  // "data_parallel": N >= 1 ranks, each a replica of the model with its own optimizer state,
  // batch_size / N examples of every batch (batch_size a multiple of N), the gradients summed
  // over the ranks before each update (so every replica applies the same one). On CUDA, rank r
  // runs on device r (run.device "cuda" or "cuda:0") over NCCL; on the CPU the ranks are threads.
  int data_parallel = 1;
};

// The run config of `loom-trainer rl --config RL.json` (agent RL with GRPO, trainer/rl/rl_run.h;
// every field in docs/trainer.md), with the same rules as RunConfig's.
struct RlConfig {
  std::string model_config;  // "model": {"config": PATH, "seed": N} or {"checkpoint": DIR}
  uint64_t model_seed = 1;
  std::string model_checkpoint;
  EnvironmentConfig env;    // "env": {"name", "arithmetic": {...}, "retrieval": {...}}
  RolloutOptions rollout;   // "rollout": {"max_turns", "max_turn_tokens", "max_trajectory_tokens"}
  GrpoOptions grpo;         // "grpo": {...}
  int groups_per_step = 4;  // tasks per step
  int group_size = 4;       // episodes per task (GRPO's group)
  int64_t steps = 20;       // RL steps (rollouts, one update, one weight sync)
  // "time_limit_s": no RL step starts once this many seconds have passed since the run started
  // (loading and the warm start included); the run then ends as after its last step, with its
  // checkpoint. 0: no limit.
  double time_limit_s = 0;
  OptimizerOptions optimizer;  // "optimizer" as in RunConfig ("balance" too)
  // "warm_start": {"steps", "batch_size", "lr"}: supervised steps on the environment's
  // demonstrations before RL (a model that never finishes a turn earns no reward to learn from).
  int64_t warm_start_steps = 0;
  int warm_start_batch = 4;
  double warm_start_lr = 1e-3;
  // "direct_share": the share of demonstrations answered at once, without the tools
  // (direct_answer_demonstration): a warm-started policy that sometimes skips the tool, so that RL
  // has the choice to learn. 0: every demonstration uses the tools.
  double warm_start_direct_share = 0;
  // "replay": {"capacity", "max_age", "groups"}: groups kept, their age limit in weight versions,
  // and how many are drawn into each step beside the fresh ones (0: no experience reuse).
  int replay_capacity = 0;
  int64_t replay_max_age = 2;
  int replay_groups = 0;
  // "engine": {"deterministic", "max_num_batched_tokens", "weight_dtype"}: the rollout engine's
  // numerics (deterministic: the same seed gives the same run), token budget per step, and the
  // dtype of its weight matrices ("f32" or "bf16": the weight sync rounds the trainer's f32
  // values).
  bool deterministic = true;
  int32_t max_num_batched_tokens = 2048;
  WeightDType engine_weight_dtype = WeightDType::kF32;
  // Where the trainer's model, gradients and optimizer state live and the rollout engine runs,
  // colocated ("device": "cpu", "cuda" or "cuda:N", as RUN.json's); availability is checked when
  // the model loads.
  Device device = Device::kCpu;
  // "routing_replay": "off", "measure" or "on" (MoE models; trainer/rl/routing_replay.h): the
  // rollouts record the engine's experts, and the trainer measures how often its own top-k differs
  // (measure) or also routes its forwards for the policy loss to them (on).
  RoutingReplayMode routing_replay = RoutingReplayMode::kOff;
  std::string out;               // run folder: metrics.jsonl, checkpoint-N/
  int64_t checkpoint_every = 0;  // 0: only at the end
  uint64_t seed = 0;             // tasks and sampling
  // "log_samples": this many episodes of every step (one per group in turn) written as text to
  // RUN/samples.jsonl, to read what the policy does; 0: none.
  int log_samples = 0;
};

absl::StatusOr<RlConfig> parse_rl_config(std::string_view json_text);
absl::StatusOr<RlConfig> load_rl_config(const std::string& path);

// Parses and validates RUN.json text. InvalidArgument naming the field at fault.
absl::StatusOr<RunConfig> parse_run_config(std::string_view json_text);
// Whether the run draws examples of synthetic task `name`: it is the task, or one in the mix.
bool run_uses_task(const RunConfig& config, std::string_view name);
absl::StatusOr<RunConfig> load_run_config(const std::string& path);

}  // namespace loom
