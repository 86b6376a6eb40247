// Causal attention for training on the GPU (kernels/attention_backward.h on a CUDA Exec, f32 as the
// trainer runs it): forward and backward, CUDA events, median of 11 after 2 warm-up calls.
//
// Shapes: the bundled default's MLA layers as the trainer packs them (16 sequences of 1024 tokens,
// 4 heads, d 96 = 64 + 32 rotary, dv 64), one long sequence at a production-sized MLA head
// (8192 tokens, 16 heads, d 192, dv 128) and a GQA one (4096 tokens, 32 query heads over 8, d 128,
// dv 128). FLOPs, causal (half the square), products and sums counted as 2: forward
// 2 (d + dv) per (query, key, head) pair, backward 2 (2 d + 3 dv) (S and dP recomputed by the dq
// pass and again by the dk/dv pass, dq, dk, dv) -- the FlashAttention-2 count, 2.5x the forward's
// at d = dv. Ceiling: ~60 TFLOP/s f32 on CUDA cores (bench/results/gpu-h200.md).
// Prints "ATTNTRAIN ..." lines and GPUBENCH lines (tests/gpu/run.sh's table).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention_backward.h"
#include "kernels/cuda/device.h"
#include "tests/gpu/gpu_test_support.h"

namespace loom {
namespace {

constexpr double kF32Flops = 60e12;

const Exec& gpu() {
  static const Exec ex = cuda::device_exec(0);
  return ex;
}

Tensor random_device(std::mt19937_64& rng, Shape shape) {
  Tensor h = Tensor::empty(shape);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (int64_t i = 0; i < h.numel(); ++i) h.data<float>()[i] = n(rng);
  return cuda::to_device(h);
}

struct Case {
  int64_t B, T, Hq, Hkv, d, dv;
};

void run() {
  cuda::init();
  std::mt19937_64 rng(20261202);
  for (const Case& c : {Case{16, 1024, 4, 4, 96, 64}, Case{1, 8192, 16, 16, 192, 128},
                        Case{1, 4096, 32, 8, 128, 128}}) {
    const int64_t N = c.B * c.T;
    const Tensor q = random_device(rng, {N, c.Hq, c.d}), k = random_device(rng, {N, c.Hkv, c.d}),
                 v = random_device(rng, {N, c.Hkv, c.dv}),
                 d_out = random_device(rng, {N, c.Hq, c.dv});
    const Tensor out = Tensor::empty({N, c.Hq, c.dv}, DType::kF32, Device::cuda(0)),
                 lse = Tensor::empty({N, c.Hq}, DType::kF32, Device::cuda(0)),
                 dq = Tensor::empty(q.shape(), DType::kF32, Device::cuda(0)),
                 dk = Tensor::empty(k.shape(), DType::kF32, Device::cuda(0)),
                 dv = Tensor::empty(v.shape(), DType::kF32, Device::cuda(0));
    Tensor cu_host = Tensor::empty({c.B + 1}, DType::kI64);
    for (int64_t b = 0; b <= c.B; ++b) cu_host.data<int64_t>()[b] = b * c.T;
    const Tensor cu = cuda::to_device(cu_host);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    const auto forward = [&](int) {
      causal_attention_varlen_forward(gpu(), q, k, v, cu, c.T, scale, out, lse);
    };
    const auto backward = [&](int) {
      causal_attention_varlen_backward(gpu(), q, k, v, cu, c.T, out, lse, d_out, scale, dq, dk, dv);
    };
    const double f_ms = median_event_ms(cuda::stream_of(gpu()), forward, 11, 2);
    const double b_ms = median_event_ms(cuda::stream_of(gpu()), backward, 11, 2);
    const double pairs = c.B * (c.T * (c.T + 1) / 2.0) * c.Hq;
    const double f_flops = pairs * 2.0 * (c.d + c.dv), b_flops = pairs * 2.0 * (2 * c.d + 3 * c.dv);
    char tag[96];
    std::snprintf(tag, sizeof(tag), "B%lld_T%lld_H%lldx%lld_d%lld_dv%lld",
                  static_cast<long long>(c.B), static_cast<long long>(c.T),
                  static_cast<long long>(c.Hq), static_cast<long long>(c.Hkv),
                  static_cast<long long>(c.d), static_cast<long long>(c.dv));
    std::printf(
        "ATTNTRAIN %s forward %.3f ms %.2f TFLOP/s (%.1f%% of f32); backward %.3f ms %.2f TFLOP/s "
        "(%.1f%%)\n",
        tag, f_ms, f_flops / f_ms / 1e9, 100 * f_flops / f_ms / 1e-3 / kF32Flops, b_ms,
        b_flops / b_ms / 1e9, 100 * b_flops / b_ms / 1e-3 / kF32Flops);
    emit_gpubench((std::string("attention_train_forward_f32_") + tag).c_str(), f_flops / f_ms / 1e9,
                  "TFLOP/s", kF32Flops / 1e12, f_ms);
    emit_gpubench((std::string("attention_train_backward_f32_") + tag).c_str(),
                  b_flops / b_ms / 1e9, "TFLOP/s", kF32Flops / 1e12, b_ms);
  }
}

}  // namespace
}  // namespace loom

int main() {
  cudaDeviceProp prop{};
  LOOM_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s\n", prop.name);
  loom::run();
  return 0;
}
