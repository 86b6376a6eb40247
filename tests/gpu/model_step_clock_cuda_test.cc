// The engine's device step clock on the GPU (engine/step_clock.h; issue 15's "GPU idle gap between
// decode steps"). Oracles: host sleeps of known length between marks (the device is idle for at
// least that long and, on an otherwise idle GPU, not much longer), and the host's wall clock
// around an engine run (busy plus idle device time fits inside it). Each check prints
// "GPUCHECK <name> <value> <bound> <PASS|FAIL>" for run.sh's table.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/allocator.h"
#include "engine/engine.h"
#include "engine/model/model.h"
#include "engine/step_clock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/launch.h"
#include "kernels/exec.h"
#include "tests/gpu/gpu_test_support.h"
#include "tests/gpu/model_test_support.h"

namespace loom {
namespace {

void check_le(const std::string& name, double value, double bound) {
  const bool pass = value <= bound;
  std::printf("GPUCHECK %s %.3e %.3e %s\n", name.c_str(), value, bound, pass ? "PASS" : "FAIL");
  std::fflush(stdout);
  EXPECT_LE(value, bound) << name;
}

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// Device work of a few hundred microseconds: copies between two 64 MiB buffers.
struct Work {
  Exec ex = exec_for(Device::kCuda);
  size_t bytes = size_t{64} << 20;
  std::shared_ptr<void> a = allocate_buffer(bytes, Device::kCuda),
                        b = allocate_buffer(bytes, Device::kCuda);
  void run(int copies) {
    for (int i = 0; i < copies; ++i)
      copy_async(ex, (i % 2 ? a : b).get(), (i % 2 ? b : a).get(), bytes);
  }
};

TEST(DeviceStepClockCuda, GapsAreTheHostsSleeps) {
  ASSERT_TRUE(device_available(Device::kCuda).ok());
  Work w;
  DeviceStepClock clock(Device::kCuda);
  ASSERT_TRUE(clock.enabled());
  // Step 1 (decode), 30 ms of host time, step 2 (decode, follows), 10 ms, step 3 (prefill,
  // follows), 20 ms, step 4 (decode, does not follow: the loop waited for requests).
  const int sleeps[] = {30, 10, 20};
  const bool decode[] = {true, true, false, true};
  const bool follows[] = {false, true, true, false};
  for (int s = 0; s < 4; ++s) {
    clock.begin_step(decode[s], follows[s]);
    clock.mark_start(w.ex);
    w.run(8);
    clock.mark_start(w.ex);  // a second mark in one step changes nothing
    clock.mark_end(w.ex);
    synchronize(w.ex);
    if (s < 3) sleep_ms(sleeps[s]);
  }
  const StepClockTotals t = clock.totals(/*settle=*/true);
  EXPECT_EQ(t.all.steps, 4);
  EXPECT_EQ(t.all.gaps, 2);  // before steps 2 and 3
  EXPECT_EQ(t.decode.steps, 3);
  EXPECT_EQ(t.decode.gaps, 1);  // before step 2
  // The gaps measured are the sleeps before steps 2 and 3 (30 + 10 ms; step 4's 20 ms follows
  // no step), each plus the wait's wake-up and the next enqueue: bounded by 5 ms a gap on an
  // idle GPU. The decode gap is step 2's; the largest, the 30 ms.
  check_le("step_clock_gap_at_least_sleeps", 40.0 - t.all.gap_ms, 0.0);
  check_le("step_clock_gap_over_sleeps_ms", t.all.gap_ms - 40.0, 10.0);
  check_le("step_clock_decode_gap_at_least_sleep", 30.0 - t.decode.gap_ms, 0.0);
  check_le("step_clock_decode_gap_over_sleep_ms", t.decode.gap_ms - 30.0, 5.0);
  check_le("step_clock_max_gap_at_least_sleep", 30.0 - t.all.max_gap_ms, 0.0);
  // Eight 64 MiB copies a step: more than a microsecond, far less than a sleep.
  EXPECT_GT(t.all.busy_ms, 0.0);
  check_le("step_clock_busy_per_step_ms", t.all.busy_ms / 4, 10.0);
}

TEST(DeviceStepClockCuda, AStepWithoutDeviceWorkBreaksTheChain) {
  ASSERT_TRUE(device_available(Device::kCuda).ok());
  Work w;
  DeviceStepClock clock(Device::kCuda);
  clock.begin_step(true, false);
  clock.mark_start(w.ex);
  w.run(2);
  clock.mark_end(w.ex);
  clock.begin_step(true, true);  // nothing marked: dropped
  clock.mark_end(w.ex);
  sleep_ms(5);
  clock.begin_step(true, true);  // follows the dropped step: no gap measured
  clock.mark_start(w.ex);
  w.run(2);
  clock.mark_end(w.ex);
  clock.begin_step(true, true);  // a failed step: never marks its end
  clock.mark_start(w.ex);
  clock.begin_step(true, true);  // follows the failed one: no gap either
  clock.mark_start(w.ex);
  clock.mark_end(w.ex);
  const StepClockTotals t = clock.totals(/*settle=*/true);
  EXPECT_EQ(t.all.steps, 3);
  EXPECT_EQ(t.all.gaps, 0);
}

// An engine on a fixture: 6 requests decoding together. Its stats' device times are positive,
// and busy plus idle device time fits in the host's wall time around the run.
TEST(DeviceStepClockCuda, EngineStatsFitTheWallClock) {
  const std::string dir = fixtures_dir() + "/kimi_linear_s0";
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "no fixture " << dir;
  for (bool graphs : {true, false}) {
    auto model = Model::load(dir, Placement{.device = Device::kCuda, .dtype = WeightDType::kF32});
    ASSERT_TRUE(model.ok()) << model.status();
    const int64_t vocab = (*model)->config().vocab_size;
    EngineOptions opt;
    opt.cache_budget_bytes = int64_t{64} << 20;
    opt.page_size = 16;
    opt.max_num_seqs = 8;
    opt.cuda_graphs = graphs;
    auto e = Engine::create(std::move(*model), nullptr, opt);
    ASSERT_TRUE(e.ok()) << e.status();
    std::mt19937_64 rng(gpu_test_seed() + 5);
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (int i = 0; i < 6; ++i) {
      Request r;
      r.prompt = random_ids(20 + 7 * i, vocab, rng);
      r.params.temperature = 0;
      r.params.max_tokens = 24;
      r.params.ignore_eos = true;
      streams.push_back(*(*e)->submit(r));
    }
    for (auto& s : streams)
      while (auto ev = s->next()) EXPECT_NE(ev->finish, FinishReason::kError) << ev->error;
    sleep_ms(50);  // the loop publishes after the step that ended the last stream
    const double wall_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const EngineStats s = (*e)->stats();
    const std::string tag = graphs ? "engine_graphs_" : "engine_eager_";
    std::printf(
        "GPUINFO %s steps %lld timed %lld decode %lld busy %.3f ms gaps %lld idle %.3f ms "
        "(decode %.3f / %.3f ms, max gap %.3f ms), wall %.1f ms\n",
        tag.c_str(), static_cast<long long>(s.steps),
        static_cast<long long>(s.device_clock.all.steps),
        static_cast<long long>(s.device_clock.decode.steps), s.device_clock.all.busy_ms,
        static_cast<long long>(s.device_clock.all.gaps), s.device_clock.all.gap_ms,
        s.device_clock.decode.busy_ms, s.device_clock.decode.gap_ms,
        s.device_clock.decode.max_gap_ms, wall_ms);
    EXPECT_EQ(s.device_clock.all.steps, s.steps);  // every step had device work and ended
    EXPECT_GE(s.device_clock.decode.steps, 20);    // 24 tokens each: at least 20 all-decode steps
    EXPECT_GT(s.device_clock.decode.gaps, 0);
    EXPECT_GT(s.device_clock.decode.busy_ms, 0.0);
    EXPECT_GE(s.device_clock.all.gap_ms, 0.0);
    check_le(tag + "busy_plus_idle_over_wall",
             (s.device_clock.all.busy_ms + s.device_clock.all.gap_ms) / wall_ms, 1.0);
  }
}

}  // namespace
}  // namespace loom
