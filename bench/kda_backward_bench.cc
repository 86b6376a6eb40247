// The delta-rule backward on the CPU: the recurrence (kda_recurrent_backward: a forward sweep
// keeping a state every 64 tokens, then per token replay and reverse step) against the chunked
// WY/UT form (kda_chunked_backward: chunk-boundary states, then per chunk recompute and GEMMs).
// Inputs as the trainer feeds them: L2-normalised q and k, bounded decays, an initial state and
// the final state's gradient. tokens/s counts the sequence's tokens (all heads).
#include <cmath>
#include <random>

#include "bench/kda_bench_inputs.h"
#include "benchmark/benchmark.h"
#include "kernels/kda_backward.h"

namespace loom {
namespace {

struct KdaBackwardArgs {
  Tensor q, k, v, g, beta, s0, d_out, d_final, dq, dk, dv, dg, dbeta, ds0;
};

KdaBackwardArgs make_args(int64_t T, int64_t H, int64_t d) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const bench::KdaBenchInputs in = bench::kda_bench_inputs(T, H, d, rng);
  KdaBackwardArgs a{in.q, in.k, in.v, in.g, in.beta};
  a.s0 = bench::filled({H, d, d}, [&] { return 0.1f * nd(rng); });
  a.d_out = bench::filled({T, H, d}, [&] { return nd(rng); });
  a.d_final = bench::filled({H, d, d}, [&] { return nd(rng); });
  for (Tensor* t : {&a.dq, &a.dk, &a.dv, &a.dg}) *t = Tensor::empty({T, H, d});
  a.dbeta = Tensor::empty({T, H});
  a.ds0 = Tensor::empty({H, d, d});
  return a;
}

template <bool kChunked>
void BM_KdaBackward(benchmark::State& st) {
  const int64_t T = st.range(0), H = st.range(1), d = st.range(2);
  KdaBackwardArgs a = make_args(T, H, d);
  const float scale = 1.0f / std::sqrt(float(d));
  const auto backward = kChunked ? kda_chunked_backward : kda_recurrent_backward;
  for (auto _ : st) {
    backward(host_exec(), a.q, a.k, a.v, a.g, a.beta, scale, a.s0, a.d_out, a.d_final, a.dq, a.dk,
             a.dv, a.dg, a.dbeta, a.ds0);
    benchmark::DoNotOptimize(a.dq.raw());
  }
  st.counters["tokens/s"] =
      benchmark::Counter(double(T), benchmark::Counter::kIsIterationInvariantRate);
}
// Short (the recurrence's side of the dispatch threshold) to long sequences, H 4, d 128.
void backward_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"T", "H", "d"});
  for (int64_t T : {4, 8, 16, 64, 1024, 4096}) b->Args({T, 4, 128});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}
BENCHMARK(BM_KdaBackward<true>)->Name("kda_chunked_backward")->Apply(backward_shapes);
BENCHMARK(BM_KdaBackward<false>)->Name("kda_recurrent_backward")->Apply(backward_shapes);

}  // namespace
}  // namespace loom
