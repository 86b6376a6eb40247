// The expanded-form MLA prefill kernel (kernels/cuda/mla_expanded_launch.h) on long causal
// problems: CUDA events around each call (median of several after a warm-up), TFLOP/s beside
// the H200's dense bf16 peak (989 TFLOP/s, the datasheet's; cuBLAS reaches ~790 on random data,
// bench/results/gpu-h200.md). Shapes: H = 32, dn = 128, dr = 64, dv = 128 (DeepSeek-V3 / Kimi):
//   - T = 8192 and T = 16384 fresh (past 0, one key block);
//   - T = 8192 at past = 122880 over 8 blocks of 16384 keys (the steady state of a 1M-token
//     prefill in 8K chunks: 7 fully visible blocks, then the block holding the diagonal), the
//     running state in f32 between the launches.
// FLOPs: 2 * visible (row, key) pairs * H * (dn + dr + dv), the useful work (Q K^T and P V);
// masked halves of diagonal tiles are not counted. Inputs: uniform random bf16 (standard
// deviation 1) filled on the device; the output is bf16.
// Prints a markdown table and GPUBENCH lines. tests/gpu/mla_expanded_peer.py times PyTorch's
// scaled_dot_product_attention on the same shapes.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/cuda/launch.h"
#include "kernels/cuda/mla_expanded_launch.h"
#include "kernels/cuda/random_fill_launch.h"
#include "tests/gpu/gpu_test_support.h"

namespace loom {
namespace {

constexpr int kH = 32, kDn = 128, kDr = 64, kDv = 128;
constexpr double kPeak = 989.0;  // TFLOP/s, dense bf16

struct Shape {
  std::string name;
  int T = 0;
  int64_t past = 0;
  int64_t block = 0;  // keys per launch (0: one block)
};

struct Row {
  std::string name;
  int T;
  int64_t past, block;
  int launches;
  double ms, tflops;
};

int run() {
  cudaStream_t stream;
  LOOM_CUDA_CHECK(cudaStreamCreate(&stream));
  const std::vector<Shape> shapes = {
      {"fresh_T8192", 8192, 0, 0},
      {"fresh_T16384", 16384, 0, 0},
      {"past122880_T8192_blocks16384", 8192, 122880, 16384},
  };
  int64_t max_keys = 0, max_t = 0;
  for (const Shape& s : shapes) {
    max_keys = std::max<int64_t>(max_keys, s.past + s.T);
    max_t = std::max<int64_t>(max_t, s.T);
  }
  const int64_t q_row = kH * (kDn + kDr), kv_row = kH * (kDn + kDv), rope_row = kDr;
  const int64_t out_row = kH * kDv;
  void *q, *kv, *rope, *out;
  float *acc, *ml;
  LOOM_CUDA_CHECK(cudaMalloc(&q, max_t * q_row * 2));
  LOOM_CUDA_CHECK(cudaMalloc(&kv, max_keys * kv_row * 2));
  LOOM_CUDA_CHECK(cudaMalloc(&rope, max_keys * rope_row * 2));
  LOOM_CUDA_CHECK(cudaMalloc(&out, max_t * out_row * 2));
  LOOM_CUDA_CHECK(cudaMalloc(&acc, max_t * kH * kDv * sizeof(float)));
  LOOM_CUDA_CHECK(cudaMalloc(&ml, max_t * kH * 2 * sizeof(float)));
  // Uniform in +-sqrt(3): standard deviation 1.
  const float step = std::sqrt(3.0f) / 8388608.0f;
  cuda::launch::random_fill(stream, q, true, max_t * q_row, 11, 0, 0.0f, step);
  cuda::launch::random_fill(stream, kv, true, max_keys * kv_row, 12, 0, 0.0f, step);
  cuda::launch::random_fill(stream, rope, true, max_keys * rope_row, 13, 0, 0.0f, step);
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));

  std::vector<Row> rows;
  for (const Shape& s : shapes) {
    const int64_t nkeys = s.past + s.T;
    const int64_t block = s.block > 0 ? s.block : nkeys;
    const int launches = static_cast<int>((nkeys + block - 1) / block);
    cuda::launch::MlaExpandedArgs a;
    a.q = q;
    a.q_row = q_row;
    a.kv_row = kv_row;
    a.rope_row = rope_row;
    a.T = s.T;
    a.H = kH;
    a.dn = kDn;
    a.dr = kDr;
    a.dv = kDv;
    a.past = s.past;
    a.scale = 1.0f / std::sqrt(static_cast<float>(kDn + kDr));
    a.acc = acc;
    a.ml = ml;
    a.out = out;
    a.out_row = out_row;
    auto call = [&](int) {
      for (int b = 0; b < launches; ++b) {
        a.key0 = b * block;
        a.nk = std::min(block, nkeys - a.key0);
        a.kv = static_cast<const uint16_t*>(kv) + a.key0 * kv_row;
        a.k_rope = static_cast<const uint16_t*>(rope) + a.key0 * rope_row;
        a.first = b == 0;
        a.last = b + 1 == launches;
        cuda::launch::mla_expanded_attention(stream, a);
      }
    };
    const double pairs = static_cast<double>(s.T) * s.past + 0.5 * s.T * (s.T + 1.0);
    const double flop = 2.0 * pairs * kH * (kDn + kDr + kDv);
    const int iters = flop > 5e12 ? 5 : 15;
    const double ms = median_event_ms(stream, call, iters, 2);
    const double tflops = flop / (ms * 1e9);
    rows.push_back({s.name, s.T, s.past, block, launches, ms, tflops});
    emit_gpubench(("mla_expanded_" + s.name).c_str(), tflops, "TFLOP/s", kPeak, ms);
  }

  std::printf("\n| shape | T | past | keys a launch | launches | ms | TFLOP/s | of 989 peak |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    std::printf("| %s | %d | %lld | %lld | %d | %.3f | %.1f | %.1f%% |\n", r.name.c_str(), r.T,
                static_cast<long long>(r.past), static_cast<long long>(r.block), r.launches, r.ms,
                r.tflops, 100.0 * r.tflops / kPeak);
  }
  std::fflush(stdout);
  for (void* p : {q, kv, rope, out, static_cast<void*>(acc), static_cast<void*>(ml)})
    LOOM_CUDA_CHECK(cudaFree(p));
  LOOM_CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace
}  // namespace loom

int main() { return loom::run(); }
