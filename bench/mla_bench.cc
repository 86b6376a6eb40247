// Absorbed MLA decode: T = 1, H = 32, dn = 128, dr = 64, dv = 128, R = 512, S cached positions.
// Reports the latent cache read rate ((R + dr) * S * 4 bytes per call, once) and GFLOP/s over
// the S-dependent work 2 * H * S * (2R + dr) plus the per-head absorptions 2 * H * R * (dn + dv).
#include <benchmark/benchmark.h>

#include <cmath>
#include <random>

#include "kernels/attention.h"

namespace loom {
namespace {

Tensor random_tensor(Shape shape, std::mt19937& rng, float scale) {
  Tensor t = Tensor::empty(shape);
  std::uniform_real_distribution<float> dist(-scale, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

void BM_MlaAbsorbedDecode(benchmark::State& state) {
  const int64_t s = state.range(0);
  const MlaDims m{32, 128, 64, 128, 512};
  std::mt19937 rng(2);
  Tensor q = random_tensor({1, m.heads, m.nope_dim + m.rope_dim}, rng, 1.0f);
  Tensor c = random_tensor({s, m.latent_dim}, rng, 1.0f);
  Tensor kr = random_tensor({s, m.rope_dim}, rng, 1.0f);
  Tensor kv_b = random_tensor({m.heads * (m.nope_dim + m.v_dim), m.latent_dim}, rng,
                              1.0f / std::sqrt(float(m.latent_dim)));
  Tensor out = Tensor::empty({1, m.heads, m.v_dim});
  const float scale = 1.0f / std::sqrt(float(m.nope_dim + m.rope_dim));
  for (auto _ : state) {
    mla_attention_absorbed(host_exec(), q, CacheView::contiguous(c), CacheView::contiguous(kr),
                           kv_b, m, scale, out);
    benchmark::ClobberMemory();
  }
  const double bytes = double(m.latent_dim + m.rope_dim) * double(s) * 4.0;
  const double flops = 2.0 * m.heads * double(s) * (2.0 * m.latent_dim + m.rope_dim) +
                       2.0 * m.heads * double(m.latent_dim) * (m.nope_dim + m.v_dim);
  state.counters["cacheGB/s"] =
      benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_MlaAbsorbedDecode)
    ->ArgName("S")
    ->Arg(1024)
    ->Arg(8192)
    ->Arg(32768)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace loom
