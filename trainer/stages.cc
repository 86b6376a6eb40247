#include "trainer/stages.h"

#include <algorithm>
#include <cmath>

namespace loom {

namespace {

// The mean of `losses`, summed in order.
double mean_of(std::span<const double> losses) {
  double sum = 0;
  for (double x : losses) sum += x;
  return sum / static_cast<double>(losses.size());
}

}  // namespace

bool loss_is_stable(std::span<const double> losses, const StabilityRule& rule) {
  const size_t w = static_cast<size_t>(std::max(rule.window, 1));
  if (losses.size() < 2 * w) return false;
  const double last = mean_of(losses.last(w));
  const double before = mean_of(losses.subspan(losses.size() - 2 * w, w));
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
    return mean_of(losses.last(w)) < stage.target_loss ? StageEnd::kTargetLoss : StageEnd::kNone;
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
