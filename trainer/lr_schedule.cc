#include "trainer/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "absl/strings/str_cat.h"

namespace loom {

absl::Status LrSchedule::validate() const {
  if (!(peak_lr > 0.0) || !std::isfinite(peak_lr))
    return absl::InvalidArgumentError(
        absl::StrCat("lr schedule: peak_lr ", peak_lr, " must be > 0"));
  if (min_lr < 0.0 || min_lr > peak_lr)
    return absl::InvalidArgumentError(
        absl::StrCat("lr schedule: min_lr ", min_lr, " must be in [0, peak_lr = ", peak_lr, "]"));
  if (total_steps < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("lr schedule: total_steps ", total_steps, " must be >= 1"));
  if (warmup_steps < 0 || warmup_steps > total_steps)
    return absl::InvalidArgumentError(absl::StrCat("lr schedule: warmup_steps ", warmup_steps,
                                                   " must be in [0, total_steps = ", total_steps,
                                                   "]"));
  return absl::OkStatus();
}

double LrSchedule::at(int64_t step) const {
  if (warmup_steps > 0 && step <= warmup_steps)
    return peak_lr * static_cast<double>(step) / warmup_steps;
  if (step >= total_steps) return min_lr;
  const double progress =
      static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
  return min_lr + 0.5 * (peak_lr - min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace loom
