// linear_forward throughput: out[M, N] = x[M, K] @ w[N, K]^T. GFLOP/s = 2 M N K / t.
#include <benchmark/benchmark.h>

#include <random>

#include "kernels/gemm.h"

namespace loom {
namespace {

Tensor random_tensor(Shape shape, std::mt19937& rng) {
  Tensor t = Tensor::empty(shape);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

// state.range(2): 1 runs in batch-invariant mode (the engine's --deterministic).
void BM_LinearForward(benchmark::State& state) {
  const int64_t m = state.range(0), k = state.range(1), n = state.range(1);
  Exec ex;
  ex.batch_invariant = state.range(2) != 0;
  std::mt19937 rng(1);
  Tensor x = random_tensor({m, k}, rng), w = random_tensor({n, k}, rng);
  Tensor out = Tensor::empty({m, n});
  for (auto _ : state) {
    linear_forward(ex, x, w, out);
    benchmark::ClobberMemory();
  }
  const double flops = 2.0 * double(m) * double(n) * double(k);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  // Weight bytes streamed per call (the bound for small M).
  state.counters["wGB/s"] =
      benchmark::Counter(double(n * k) * 4e-9, benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_LinearForward)
    ->ArgNames({"M", "K=N", "invariant"})
    ->ArgsProduct({{1, 2, 4, 8, 16, 64, 2048}, {2048, 4096}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace loom
