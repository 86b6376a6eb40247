// The engine's step clock (engine/step_clock.h) on the host: its arithmetic, and that the host
// measures nothing (the device clock exists on a GPU; tests/gpu/model_step_clock_cuda_test.cc
// checks it there against host sleeps and the wall clock).
#include "engine/step_clock.h"

#include "gtest/gtest.h"
#include "kernels/exec.h"

namespace loom {
namespace {

TEST(StepClock, AddStepSplitsDecodeStepsAndGaps) {
  StepClockTotals t;
  add_step(t, /*decode=*/true, 2.0, /*has_gap=*/false, 0.0);
  add_step(t, true, 3.0, true, 0.25);
  add_step(t, false, 10.0, true, 1.5);
  add_step(t, true, 4.0, true, 0.5);
  EXPECT_EQ(t.all.steps, 4);
  EXPECT_DOUBLE_EQ(t.all.busy_ms, 19.0);
  EXPECT_EQ(t.all.gaps, 3);
  EXPECT_DOUBLE_EQ(t.all.gap_ms, 2.25);
  EXPECT_DOUBLE_EQ(t.all.max_gap_ms, 1.5);
  EXPECT_EQ(t.decode.steps, 3);
  EXPECT_DOUBLE_EQ(t.decode.busy_ms, 9.0);
  EXPECT_EQ(t.decode.gaps, 2);
  EXPECT_DOUBLE_EQ(t.decode.gap_ms, 0.75);
  EXPECT_DOUBLE_EQ(t.decode.max_gap_ms, 0.5);
}

TEST(StepClock, MergeAddsRanks) {
  StepClockTotals a, b;
  add_step(a, true, 2.0, true, 0.5);
  add_step(b, false, 3.0, true, 1.5);
  add_step(b, true, 1.0, false, 0.0);
  merge(a, b);
  EXPECT_EQ(a.all.steps, 3);
  EXPECT_DOUBLE_EQ(a.all.busy_ms, 6.0);
  EXPECT_EQ(a.all.gaps, 2);
  EXPECT_DOUBLE_EQ(a.all.gap_ms, 2.0);
  EXPECT_DOUBLE_EQ(a.all.max_gap_ms, 1.5);
  EXPECT_EQ(a.decode.steps, 2);
  EXPECT_EQ(a.decode.gaps, 1);
  EXPECT_DOUBLE_EQ(a.decode.max_gap_ms, 0.5);
}

TEST(StepClock, TheHostMeasuresNothing) {
  DeviceStepClock clock(Device::kCpu);
  EXPECT_FALSE(clock.enabled());
  for (int i = 0; i < 3; ++i) {
    clock.begin_step(true, i > 0);
    clock.mark_start(host_exec());
    clock.mark_end(host_exec());
  }
  const StepClockTotals& t = clock.totals(/*settle=*/true);
  EXPECT_EQ(t.all.steps, 0);
  EXPECT_EQ(t.all.gaps, 0);
  EXPECT_EQ(t.all.busy_ms, 0.0);
}

}  // namespace
}  // namespace loom
