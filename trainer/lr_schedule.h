// The learning rate over a run: linear warmup from 0, then a cosine decay to min_lr at
// total_steps (constant min_lr after it).
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace loom {

struct LrSchedule {
  double peak_lr = 3e-4;
  double min_lr = 3e-5;
  int64_t warmup_steps = 100;
  int64_t total_steps = 1000;

  // InvalidArgument naming the field when the schedule makes no sense (negative rates, min above
  // peak, warmup past the end, no steps).
  absl::Status validate() const;
  // The rate for update number `step` (1 for the first update).
  double at(int64_t step) const;
};

}  // namespace loom
