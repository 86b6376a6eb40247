// What the GPU tests and benchmarks share: the run's random seed (printed, so a failure reruns
// with LOOM_GPU_TEST_SEED=<it>) and CUDA-event timing (median of many timed calls after warm-up).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

#include "kernels/cuda/check.h"

namespace loom {

// The seed of this run: LOOM_GPU_TEST_SEED, or a fresh one; printed once.
inline uint64_t gpu_test_seed() {
  static const uint64_t seed = [] {
    const char* env = std::getenv("LOOM_GPU_TEST_SEED");
    const uint64_t s = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
    std::printf("LOOM_GPU_TEST_SEED=%llu\n", static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

// The median, in ms, of `iters` timed calls fn(i) on `stream`, after `warmup` untimed calls and a
// device synchronisation. `pad`, if given, runs before each start event (not timed).
inline double median_event_ms(cudaStream_t stream, const std::function<void(int)>& fn, int iters,
                              int warmup, const std::function<void()>& pad = nullptr) {
  for (int i = 0; i < warmup; ++i) fn(i);
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  LOOM_CUDA_CHECK(cudaEventCreate(&a));
  LOOM_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    if (pad) pad();
    LOOM_CUDA_CHECK(cudaEventRecord(a, stream));
    fn(i);
    LOOM_CUDA_CHECK(cudaEventRecord(b, stream));
    LOOM_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0.0f;
    LOOM_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  LOOM_CUDA_CHECK(cudaEventDestroy(a));
  LOOM_CUDA_CHECK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// One "GPUBENCH <name> <achieved> <unit> <roofline> <fraction> <median ms>" line.
inline void emit_gpubench(const char* name, double achieved, const char* unit, double roof,
                          double ms) {
  std::printf("GPUBENCH %s %.1f %s %.1f %.3f %.4f\n", name, achieved, unit, roof, achieved / roof,
              ms);
  std::fflush(stdout);
}

}  // namespace loom
