// Random KDA inputs shared by the CPU KDA benchmarks (kda_bench.cc, kda_backward_bench.cc): q and
// k of about unit norm, unit-variance v, bounded decays g = -5 sigmoid(N(0, 1)) and beta =
// sigmoid(N(0, 1)), [T, H, d] and [T, H], from a fixed seed.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>

#include "core/tensor.h"

namespace loom::bench {

// A tensor of `shape` filled by successive calls of `next`.
template <typename Next>
Tensor filled(Shape shape, Next next) {
  Tensor t = Tensor::empty(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = next();
  return t;
}

struct KdaBenchInputs {
  Tensor q, k, v, g, beta;
};

// Draws from `rng` (which the caller may keep drawing from for further tensors).
inline KdaBenchInputs kda_bench_inputs(int64_t T, int64_t H, int64_t d, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const float inv = 1.0f / std::sqrt(float(d));
  KdaBenchInputs in;
  in.q = filled({T, H, d}, [&] { return nd(rng) * inv; });
  in.k = filled({T, H, d}, [&] { return nd(rng) * inv; });
  in.v = filled({T, H, d}, [&] { return nd(rng); });
  in.g = filled({T, H, d}, [&] { return -5.0f / (1.0f + std::exp(-nd(rng))); });
  in.beta = filled({T, H}, [&] { return 1.0f / (1.0f + std::exp(-nd(rng))); });
  return in;
}

}  // namespace loom::bench
