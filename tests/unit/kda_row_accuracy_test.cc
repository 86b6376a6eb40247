// Per-row accuracy of the KDA kernels. The mixer RMS-normalises each head's output row (o_norm), so
// what reaches the next layer is the error relative to that row's own size, not to the largest
// entry of the tensor; rows that are small after cancellation amplify it by up to 1 / rms(row).
// Both kernels are compared with a double oracle on the same f32 inputs, and the chunked form must
// stay as accurate per row as the recurrence (the reference's algorithm). Before the exponent
// remainder was carried (kernels/cpu/kda.cc, exp8_split), the chunked form's factorised diagonal
// blocks were ~3.5x less accurate per row, which fla_kda_s0 amplified into a 1.1e-3 logit error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/kda.h"

namespace loom {
namespace {

struct Inputs {
  int64_t T, H, dk, dv;
  std::vector<float> q, k, v, g, beta;
};

// Like fla_kda_s0's activations: unit q and k, v of rms 0.5, beta in (0, 1), bounded-gate decays
// spread over (-5, 0) per channel (so a 16-token sub-chunk spans up to ~75 nats).
Inputs make_inputs(int64_t T, int64_t H, int64_t dk, int64_t dv, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  Inputs in{T, H, dk, dv};
  in.q.resize(T * H * dk);
  in.k.resize(T * H * dk);
  in.v.resize(T * H * dv);
  in.g.resize(T * H * dk);
  in.beta.resize(T * H);
  auto unit = [&](float* x, int64_t d) {
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) {
      x[i] = n01(rng);
      ss += double(x[i]) * x[i];
    }
    for (int64_t i = 0; i < d; ++i) x[i] = float(x[i] / std::sqrt(ss));
  };
  for (int64_t r = 0; r < T * H; ++r) {
    unit(&in.q[r * dk], dk);
    unit(&in.k[r * dk], dk);
    for (int64_t i = 0; i < dv; ++i) in.v[r * dv + i] = 0.5f * n01(rng);
    for (int64_t i = 0; i < dk; ++i) in.g[r * dk + i] = -5.0f / (1.0f + std::exp(-2.0f * n01(rng)));
    in.beta[r] = u01(rng);
  }
  return in;
}

std::vector<double> oracle(const Inputs& in, double scale) {
  const int64_t T = in.T, H = in.H, dk = in.dk, dv = in.dv;
  std::vector<double> out(T * H * dv);
  for (int64_t h = 0; h < H; ++h) {
    std::vector<double> S(dk * dv, 0.0), kv(dv);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t r = t * H + h;
      std::fill(kv.begin(), kv.end(), 0.0);
      for (int64_t i = 0; i < dk; ++i) {
        const double e = std::exp(double(in.g[r * dk + i]));
        for (int64_t j = 0; j < dv; ++j) {
          S[i * dv + j] *= e;
          kv[j] += in.k[r * dk + i] * S[i * dv + j];
        }
      }
      for (int64_t j = 0; j < dv; ++j) kv[j] = in.beta[r] * (in.v[r * dv + j] - kv[j]);
      for (int64_t i = 0; i < dk; ++i)
        for (int64_t j = 0; j < dv; ++j) S[i * dv + j] += in.k[r * dk + i] * kv[j];
      for (int64_t j = 0; j < dv; ++j) {
        double o = 0;
        for (int64_t i = 0; i < dk; ++i) o += scale * in.q[r * dk + i] * S[i * dv + j];
        out[r * dv + j] = o;
      }
    }
  }
  return out;
}

using KdaFn = void (*)(const Exec&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                       const Tensor&, float, const Tensor&, const Tensor&);

// RMS over rows of max_j |o_tj - ref_tj| / rms(ref_t): the error o_norm passes on.
double row_relative_error(KdaFn fn, Inputs in, const std::vector<double>& ref, float scale) {
  const int64_t T = in.T, H = in.H, dk = in.dk, dv = in.dv;
  std::vector<float> state(H * dk * dv, 0.0f), out(T * H * dv);
  fn(host_exec(), Tensor::wrap(in.q.data(), {T, H, dk}, DType::kF32),
     Tensor::wrap(in.k.data(), {T, H, dk}, DType::kF32),
     Tensor::wrap(in.v.data(), {T, H, dv}, DType::kF32),
     Tensor::wrap(in.g.data(), {T, H, dk}, DType::kF32),
     Tensor::wrap(in.beta.data(), {T, H}, DType::kF32), scale,
     Tensor::wrap(state.data(), {H, dk, dv}, DType::kF32),
     Tensor::wrap(out.data(), {T, H, dv}, DType::kF32));
  double sum = 0;
  for (int64_t r = 0; r < T * H; ++r) {
    double ss = 0, m = 0;
    for (int64_t j = 0; j < dv; ++j) {
      ss += ref[r * dv + j] * ref[r * dv + j];
      m = std::max(m, std::abs(out[r * dv + j] - ref[r * dv + j]));
    }
    const double rel = m / std::sqrt(ss / dv);
    sum += rel * rel;
  }
  return std::sqrt(sum / (T * H));
}

TEST(KdaRowAccuracy, ChunkedIsAsAccuratePerRowAsRecurrent) {
  struct Case {
    int64_t T, H, dk, dv;
  };
  uint32_t seed = 900;
  for (const Case c : {Case{150, 2, 32, 32}, Case{201, 1, 40, 24}, Case{97, 3, 24, 56}}) {
    const Inputs in = make_inputs(c.T, c.H, c.dk, c.dv, seed++);
    const float scale = 1.0f / std::sqrt(float(c.dk));
    const std::vector<double> ref = oracle(in, scale);
    const double rec = row_relative_error(kda_recurrent_forward, in, ref, scale);
    const double chk = row_relative_error(kda_chunked_forward, in, ref, scale);
    std::printf(
        "[T=%lld H=%lld dk=%lld dv=%lld] per-row relative error (rms over rows): "
        "recurrent %.3g, chunked %.3g (ratio %.2f)\n",
        (long long)c.T, (long long)c.H, (long long)c.dk, (long long)c.dv, rec, chk, chk / rec);
    EXPECT_LT(chk, 1.5 * rec) << "T=" << c.T << " dk=" << c.dk << " dv=" << c.dv;
  }
}

}  // namespace
}  // namespace loom
