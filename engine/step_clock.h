// DeviceStepClock: on the device's own clock, how long each engine step keeps the device busy and
// how long the device then sits idle until the next step's first work arrives, when the loop went
// straight from one step to the next (issue 15: "the GPU idle gap between decode steps"). That
// idle time is the host's between two steps: sampling's read-back returning, emitting tokens (stop
// checks, detokenisation, streaming), taking arrivals, scheduling, packing the next step.
//
// A step's start mark is recorded just before its first device work (ModelRunner: a state-slot
// copy or reset, else the step data's upload), its end mark after the sampled tokens' read-back
// (or after its last kernel when nothing is sampled). The end mark of a step whose read-back the
// host waited for is recorded on an idle stream as the wait returns, so the few microseconds the
// wait takes to wake the host are not counted as idle. On the host nothing is measured.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "kernels/device_event.h"
#include "kernels/exec.h"

namespace loom {

struct StepTimes {
  int64_t steps = 0;   // steps whose busy time was measured
  double busy_ms = 0;  // from each one's start mark to its end mark
  int64_t gaps = 0;    // of them, steps the loop went to straight from the previous one
  double gap_ms = 0;   // device idle time before those: previous end mark to this start mark
  double max_gap_ms = 0;
};

struct StepClockTotals {
  StepTimes all;
  StepTimes decode;  // steps in which every sequence fed one token
};

// Folds measured steps into totals (the clock's arithmetic, apart from the device).
void add_step(StepClockTotals& totals, bool decode, double busy_ms, bool has_gap, double gap_ms);
// Adds `more` into `totals` (counts and times add, the largest gap is the larger): the sum over
// several engine ranks.
void merge(StepClockTotals& totals, const StepClockTotals& more);

// Owned by the engine loop thread.
class DeviceStepClock {
 public:
  // Measures on a GPU; on the host every call is a no-op and the totals stay zero.
  explicit DeviceStepClock(Device device);

  bool enabled() const { return enabled_; }
  // A step begins (before its first device work). `decode`: every sequence feeds one token;
  // `follows_previous`: the loop came straight from the previous step, with work left, so the
  // time between the two is overhead, not waiting for requests.
  void begin_step(bool decode, bool follows_previous);
  // Before device work of the current step; the first call of a step records its start mark.
  void mark_start(const Exec& ex);
  // After the current step's last device work. A step that never marked a start is dropped, and
  // the next step's gap is not measured.
  void mark_end(const Exec& ex);
  // Every finished step whose end mark the device has reached, folded in: never blocks, unless
  // `settle`, which waits for every ended step (the loop, once it has no work left).
  const StepClockTotals& totals(bool settle = false);

 private:
  struct Step {
    DeviceEvent start, end;
    bool started = false, ended = false;
    bool decode = false, follows = false;
  };
  DeviceEvent take_event();
  void resolve(bool wait_for_oldest);

  Device device_;
  bool enabled_ = false;
  std::deque<Step> pending_;       // steps begun, oldest first; the back is the current one
  DeviceEvent last_end_;           // the last resolved step's end mark
  bool have_last_end_ = false;     // whether last_end_ holds a mark
  bool chain_broken_ = false;      // a step was dropped: the next one measures no gap
  std::vector<DeviceEvent> free_;  // events to reuse
  StepClockTotals totals_;
};

}  // namespace loom
