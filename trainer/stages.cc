#include "trainer/stages.h"

#include <algorithm>
#include <cmath>

namespace loom {

bool loss_is_stable(std::span<const double> losses, const StabilityRule& rule) {
  const size_t w = static_cast<size_t>(std::max(rule.window, 1));
  if (losses.size() < 2 * w) return false;
  double last = 0, before = 0;
  const size_t n = losses.size();
  for (size_t i = 0; i < w; ++i) {
    last += losses[n - w + i];
    before += losses[n - 2 * w + i];
  }
  last /= static_cast<double>(w);
  before /= static_cast<double>(w);
  if (!std::isfinite(last) || !std::isfinite(before)) return false;
  return std::abs(last - before) < rule.tolerance * std::abs(before);
}

std::string_view stage_end_name(StageEnd end) {
  switch (end) {
    case StageEnd::kStable:
      return "stable";
    case StageEnd::kTargetLoss:
      return "target_loss";
    case StageEnd::kMaxSteps:
      return "max_steps";
    case StageEnd::kNone:
      break;
  }
  return "";
}

StageEnd stage_end(const StageConfig& stage, const StabilityRule& rule, int64_t steps_in_stage,
                   std::span<const double> losses) {
  if (steps_in_stage >= stage.max_steps) return StageEnd::kMaxSteps;
  if (steps_in_stage < stage.min_steps) return StageEnd::kNone;
  if (stage.target_loss > 0) {
    const size_t w = static_cast<size_t>(std::max(rule.window, 1));
    if (losses.size() < w) return StageEnd::kNone;
    double mean = 0;
    for (size_t i = losses.size() - w; i < losses.size(); ++i) mean += losses[i];
    mean /= static_cast<double>(w);
    return mean < stage.target_loss ? StageEnd::kTargetLoss : StageEnd::kNone;
  }
  return loss_is_stable(losses, rule) ? StageEnd::kStable : StageEnd::kNone;
}

std::vector<PositionBucket> position_buckets(int64_t seq_len, int64_t first) {
  std::vector<PositionBucket> out;
  first = std::max<int64_t>(first, 1);
  int64_t begin = 0, end = first;
  while (begin < seq_len) {
    out.push_back({begin, std::min(end, seq_len)});
    begin = end;
    end = 2 * end;
  }
  return out;
}

}  // namespace loom
