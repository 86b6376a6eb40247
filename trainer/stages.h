// Staged context extension (docs/trainer.md): a run config's list of stages, each with its own
// sequence length, RoPE base for the rotary layers and data mix. A stage ends once it has run
// min_steps and its loss is stable, or at max_steps; then the next one starts (after the last, the
// run ends). Also the position buckets of the per-length loss (loss_by_position in metrics.jsonl).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "trainer/synthetic_tasks.h"
#include "trainer/tool_dialogues.h"

namespace loom {

struct StageConfig {
  int seq_len = 256;
  double rope_theta = 0;  // the RoPE base from this stage on; 0: leave it as it is
  int64_t min_steps = 0;
  int64_t max_steps = 1;
  // > 0: the stage ends, from min_steps on, once the mean loss of its last window steps is below
  // this, and never on a stable loss (a curriculum's plateau is stable long before its task is
  // learned). 0: the stability rule.
  double target_loss = 0;
  MqarOptions mqar;                   // task mqar: data.mqar with the stage's overrides and seq_len
  ToolDialogueOptions tool_dialogue;  // task tool_dialogue: data.tool_dialogue with the overrides
  PasskeyTrainOptions passkey;        // task passkey: data.passkey with the overrides
  // Task mix: this stage's weight of each task of data.mix, in its order (0: not drawn in this
  // stage); empty: data.mix's weights.
  std::vector<double> mix_weights;
};

// "Stable": the relative change between the mean loss of the last `window` steps and that of the
// `window` steps before them is below `tolerance`: |mean(last W) - mean(previous W)| <
// tolerance * |mean(previous W)|. Fewer than 2W losses are never stable.
struct StabilityRule {
  int window = 20;
  double tolerance = 0.01;
};

// `losses`: the stage's losses so far, oldest first (at least the last 2W of them).
bool loss_is_stable(std::span<const double> losses, const StabilityRule& rule);

enum class StageEnd { kNone, kStable, kTargetLoss, kMaxSteps };
// "", "stable", "target_loss", "max_steps"
std::string_view stage_end_name(StageEnd end);

// Whether the stage ends after `steps_in_stage` steps whose recent losses are `losses`:
// kMaxSteps at max_steps; from min_steps on, kTargetLoss once the mean of the last `rule.window`
// losses is below a set target_loss, else (no target) kStable once loss_is_stable; else kNone.
StageEnd stage_end(const StageConfig& stage, const StabilityRule& rule, int64_t steps_in_stage,
                   std::span<const double> losses);

// The position buckets of loss_by_position for sequences of `seq_len` positions: [0, first),
// [first, 2 first), [2 first, 4 first), ... (powers of two), the last one cut at seq_len.
struct PositionBucket {
  int64_t begin = 0, end = 0;
};
std::vector<PositionBucket> position_buckets(int64_t seq_len, int64_t first);

}  // namespace loom
