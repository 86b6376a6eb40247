// KDA kernels: chunked vs recurrent prefill, and recurrent decode.
//
// FLOP count (both prefill forms report the same nominal count, so their rates compare directly as
// speed): the recurrence per token and value head does decay (dk*dv multiplies), S^T k (2*dk*dv),
// the rank-1 update (2*dk*dv) and the output S^T q (2*dk*dv): 7 * dk * dv FLOP. The chunked form
// does somewhat more arithmetic (~8.3 * dk * dv per token at chunk 64, d = 128) but in GEMM shape.
// Decode reports state traffic: every call reads and writes the whole f32 state once,
// 2 * Hv * dk * dv * 4 bytes per token.
#include <random>

#include "bench/kda_bench_inputs.h"
#include "benchmark/benchmark.h"
#include "kernels/kda.h"

namespace loom {
namespace {

struct KdaArgs {
  Tensor q, k, v, g, beta, state, out;
};

KdaArgs make_args(int64_t T, int64_t H, int64_t d) {
  std::mt19937 rng(7);
  const bench::KdaBenchInputs in = bench::kda_bench_inputs(T, H, d, rng);
  KdaArgs a{in.q, in.k, in.v, in.g, in.beta};
  a.state = Tensor::zeros({H, d, d});
  a.out = Tensor::empty({T, H, d});
  return a;
}

template <bool kChunked>
void BM_KdaPrefill(benchmark::State& st) {
  const int64_t T = st.range(0), H = st.range(1), d = st.range(2);
  KdaArgs a = make_args(T, H, d);
  const float scale = 1.0f / std::sqrt(float(d));
  for (auto _ : st) {
    a.state.fill(0.0f);
    if (kChunked)
      kda_chunked_forward(host_exec(), a.q, a.k, a.v, a.g, a.beta, scale, a.state, a.out);
    else
      kda_recurrent_forward(host_exec(), a.q, a.k, a.v, a.g, a.beta, scale, a.state, a.out);
    benchmark::DoNotOptimize(a.out.raw());
  }
  st.counters["FLOP/s"] = benchmark::Counter(7.0 * double(T * H) * double(d * d),
                                             benchmark::Counter::kIsIterationInvariantRate,
                                             benchmark::Counter::kIs1000);
  st.counters["tokens/s"] =
      benchmark::Counter(double(T), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_KdaPrefill<true>)
    ->Name("kda_chunked_prefill")
    ->Args({4096, 8, 128})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_KdaPrefill<false>)
    ->Name("kda_recurrent_prefill")
    ->Args({4096, 8, 128})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_KdaDecode(benchmark::State& st) {
  const int64_t H = st.range(0), d = st.range(1);
  KdaArgs a = make_args(1, H, d);
  const float scale = 1.0f / std::sqrt(float(d));
  for (auto _ : st) {
    kda_recurrent_forward(host_exec(), a.q, a.k, a.v, a.g, a.beta, scale, a.state, a.out);
    benchmark::DoNotOptimize(a.out.raw());
  }
  st.counters["bytes/s"] = benchmark::Counter(2.0 * double(H * d * d) * sizeof(float),
                                              benchmark::Counter::kIsIterationInvariantRate,
                                              benchmark::Counter::kIs1024);
}
BENCHMARK(BM_KdaDecode)
    ->Name("kda_recurrent_decode")
    ->Args({8, 128})
    ->Args({32, 128})
    ->Args({128, 128})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace
}  // namespace loom
