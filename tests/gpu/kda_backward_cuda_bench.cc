// The delta-rule backward on the GPU, both forms (kernels/kda_backward.h on a CUDA Exec): the
// chunked backward (kernels/cuda/kda_chunked_backward.cu) against the recurrent one
// (kernels/cuda/backward.cu), f32 as the trainer runs them, CUDA events around each call, median.
//
// Shapes: H = Hk = Hv in {4, 8, 16, 32}, dk = dv = 128, one sequence of T in {1024, 2048, 4096,
// 8192} tokens, and kimi_linear_s0's KDA layers (H = 2, d = 32) at T = 256 and 2048; per-channel
// (KDA) gates from the bounded gate -5 sigmoid(.), l2-normalised q and k, a zero initial state, no
// final-state gradient (the trainer's call). The recurrent form takes one block per head and walks
// the tokens, so its time grows with T and hardly with H (at most 132 heads run side by side): it
// is timed at H = 32 only (and at kimi_linear_s0's shapes).
//
// Inputs: random host tiles of 1024 tokens repeated over T on the device (as kda_chunked_bench).
//
// Counts. FLOPs: the chunked backward's arithmetic per 64-token chunk and head as the sequential
// form executes it (a forward pass for the states, the recomputation and the reverse mode;
// products and sums counted as 2): 7 C^2 dk + 6 C^2 dv + 18 C dk dv with C = 64, 24.5 MFLOP at
// dk = dv = 128, kept as the unit of work for both forms (the chunk-parallel form spends about the
// same: the forward's preparation instead of the boundary pass, plus the reverse state pass); the
// element-wise exponentials (about 3 C^2 dk / 2 a chunk) are not counted. Bytes: the fewest the op
// must move (q, k, v, g, beta, d_out read once, their gradients written once, each chunk's state
// written and read once, all f32). Ceilings of the lent H200 (bench/results/gpu-h200.md): 4.2 TB/s
// measured copy, ~60 TFLOP/s f32 on CUDA cores (~790 TFLOP/s bf16 dense on tensor cores).
// Then packed batches (16 x 1024 tokens at the bundled default's H = 4, d = 64; 8 x 1024 at H = 32,
// d = 128): kda_varlen_backward's one launch against one call per sequence.
// Prints "KDABWD <form> T=<T> H=<H> d=<d> <median> ms ..." lines (the recurrent ones with their
// ratio to the chunked time) and GPUBENCH lines for the chunked form (tests/gpu/run.sh's table).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/device.h"
#include "kernels/kda_backward.h"
#include "tests/gpu/gpu_test_support.h"

namespace loom {
namespace {

constexpr int64_t kD = 128, kMaxT = 8192, kMaxH = 32, kTile = 1024;
constexpr double kF32Flops = 60e12, kCopyBytes = 4.2e12;

const Exec& gpu() {
  static const Exec ex = cuda::device_exec(0);
  return ex;
}

// A device tensor of `rows` x `width` floats: a random host tile of kTile rows, repeated.
Tensor tiled(std::mt19937_64& rng, int64_t rows, int64_t width,
             const std::function<float(std::mt19937_64&)>& draw, bool unit_rows_of_d = false) {
  std::vector<float> tile(static_cast<size_t>(kTile * width));
  for (float& x : tile) x = draw(rng);
  if (unit_rows_of_d)
    for (size_t r = 0; r < tile.size() / kD; ++r) {
      double ss = 0.0;
      for (int64_t i = 0; i < kD; ++i) ss += double(tile[r * kD + i]) * tile[r * kD + i];
      for (int64_t i = 0; i < kD; ++i) tile[r * kD + i] /= static_cast<float>(std::sqrt(ss));
    }
  Tensor t = Tensor::empty({rows * width}, DType::kF32, Device::cuda(0));
  for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
    const int64_t n = std::min(kTile, rows - r0) * width;
    LOOM_CUDA_CHECK(cudaMemcpy(t.data<float>() + r0 * width, tile.data(), n * sizeof(float),
                               cudaMemcpyHostToDevice));
  }
  return t;
}

// The first `rows` rows of a flat [rows_max * H_max * width] buffer, as [rows, H, width].
Tensor view(const Tensor& flat, int64_t rows, int64_t H, int64_t width) {
  return flat.slice(0, 0, rows * H * width).reshape({rows, H, width});
}

struct Inputs {
  Tensor q, k, v, g, beta, d_out;  // flat buffers for T = kMaxT, H = kMaxH
};

double time_ms(const std::function<void()>& fn) {
  // One call first: a slow form (hundreds of ms) is then timed three times, a fast one eleven.
  cudaEvent_t a, b;
  LOOM_CUDA_CHECK(cudaEventCreate(&a));
  LOOM_CUDA_CHECK(cudaEventCreate(&b));
  LOOM_CUDA_CHECK(cudaEventRecord(a, cuda::stream_of(gpu())));
  fn();
  LOOM_CUDA_CHECK(cudaEventRecord(b, cuda::stream_of(gpu())));
  LOOM_CUDA_CHECK(cudaEventSynchronize(b));
  float first = 0.0f;
  LOOM_CUDA_CHECK(cudaEventElapsedTime(&first, a, b));
  LOOM_CUDA_CHECK(cudaEventDestroy(a));
  LOOM_CUDA_CHECK(cudaEventDestroy(b));
  const int iters = first > 200.0f ? 3 : 11;
  return median_event_ms(
      cuda::stream_of(gpu()), [&](int) { fn(); }, iters, 1);
}

void run() {
  cuda::init();  // device tensors are made before the first Exec
  std::mt19937_64 rng(20261202);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto randn = [&](std::mt19937_64& r) { return normal(r); };
  auto gate = [&](std::mt19937_64& r) { return -5.0f / (1.0f + std::exp(-2.0f * normal(r))); };
  auto unit = [&](std::mt19937_64& r) { return 1.0f / (1.0f + std::exp(-normal(r))); };
  const int64_t rows = kMaxT * kMaxH;  // (token, head) rows
  Inputs in{tiled(rng, rows, kD, randn, true), tiled(rng, rows, kD, randn, true),
            tiled(rng, rows, kD, randn),       tiled(rng, rows, kD, gate),
            tiled(rng, rows, 1, unit),         tiled(rng, rows, kD, randn)};
  struct Shape3 {
    int64_t T, H, d;
    bool recurrent;  // time the recurrent form too
  };
  std::vector<Shape3> shapes;
  for (const int64_t H : {4, 8, 16, 32})
    for (const int64_t T : {1024, 2048, 4096, 8192}) shapes.push_back({T, H, kD, H == 32});
  // kimi_linear_s0's KDA layers (2 heads of 32) at the trainer benchmark's sequence lengths.
  for (const int64_t T : {256, 2048}) shapes.push_back({T, 2, 32, true});
  for (const Shape3& s : shapes) {
    const int64_t T = s.T, H = s.H, d = s.d;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    const Tensor s0 = cuda::to_device(Tensor::zeros({H, d, d}));
    const Tensor q = view(in.q, T, H, d), k = view(in.k, T, H, d), v = view(in.v, T, H, d),
                 g = view(in.g, T, H, d), beta = view(in.beta, T, H, 1).reshape({T, H}),
                 d_out = view(in.d_out, T, H, d);
    const Tensor dq = Tensor::empty(q.shape(), DType::kF32, Device::cuda(0)),
                 dk = Tensor::empty(k.shape(), DType::kF32, Device::cuda(0)),
                 dv = Tensor::empty(v.shape(), DType::kF32, Device::cuda(0)),
                 dg = Tensor::empty(g.shape(), DType::kF32, Device::cuda(0)),
                 db = Tensor::empty(beta.shape(), DType::kF32, Device::cuda(0));
    const double chunks = std::ceil(T / 64.0), C = 64.0, dd = static_cast<double>(d);
    const double flops = chunks * H * (7 * C * C * dd + 6 * C * C * dd + 18 * C * dd * dd);
    const double bytes = 4.0 * (T * H * (2 * 5 * dd + 2.0) + 2 * chunks * H * dd * dd);
    const double chunked = time_ms([&] {
      kda_chunked_backward(gpu(), q, k, v, g, beta, scale, s0, d_out, Tensor(), dq, dk, dv, dg, db,
                           Tensor());
    });
    std::printf(
        "KDABWD chunked T=%lld H=%lld d=%lld %.3f ms %.2f TFLOP/s (%.1f%% of f32) %.1f GB/s "
        "(%.1f%% of copy)\n",
        static_cast<long long>(T), static_cast<long long>(H), static_cast<long long>(d), chunked,
        flops / chunked / 1e9, 100 * flops / chunked / 1e-3 / kF32Flops, bytes / chunked / 1e6,
        100 * bytes / chunked / 1e-3 / kCopyBytes);
    const std::string name = "kda_chunked_backward_f32_T" + std::to_string(T) + "_H" +
                             std::to_string(H) + "_d" + std::to_string(d);
    emit_gpubench(name.c_str(), flops / chunked / 1e9, "TFLOP/s", kF32Flops / 1e12, chunked);
    if (s.recurrent) {
      const double recurrent = time_ms([&] {
        kda_recurrent_backward(gpu(), q, k, v, g, beta, scale, s0, d_out, Tensor(), dq, dk, dv, dg,
                               db, Tensor());
      });
      std::printf("KDABWD recurrent T=%lld H=%lld d=%lld %.3f ms, %.2fx the chunked time\n",
                  static_cast<long long>(T), static_cast<long long>(H), static_cast<long long>(d),
                  recurrent, recurrent / chunked);
    }
    std::fflush(stdout);
  }
  // The trainer's packed batch: B sequences of 1024 tokens in one kda_varlen_backward launch
  // against one kda_chunked_backward call per sequence (what the trainer ran before). The
  // bundled default's KDA layers (H = 4, d = 64) and a production-sized one (H = 32, d = 128).
  struct Packed {
    int64_t B, T, H, d;
  };
  for (const Packed& s : {Packed{16, 1024, 4, 64}, Packed{8, 1024, 32, 128}}) {
    const int64_t N = s.B * s.T, H = s.H, d = s.d;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    const Tensor s0 = cuda::to_device(Tensor::zeros({H, d, d}));
    Tensor cu_host = Tensor::empty({s.B + 1}, DType::kI64);
    for (int64_t b = 0; b <= s.B; ++b) cu_host.data<int64_t>()[b] = b * s.T;
    const Tensor cu = cuda::to_device(cu_host);
    const Tensor q = view(in.q, N, H, d), k = view(in.k, N, H, d), v = view(in.v, N, H, d),
                 g = view(in.g, N, H, d), beta = view(in.beta, N, H, 1).reshape({N, H}),
                 d_out = view(in.d_out, N, H, d);
    const Tensor dq = Tensor::empty(q.shape(), DType::kF32, Device::cuda(0)),
                 dk = Tensor::empty(k.shape(), DType::kF32, Device::cuda(0)),
                 dv = Tensor::empty(v.shape(), DType::kF32, Device::cuda(0)),
                 dg = Tensor::empty(g.shape(), DType::kF32, Device::cuda(0)),
                 db = Tensor::empty(beta.shape(), DType::kF32, Device::cuda(0));
    const double chunks = std::ceil(s.T / 64.0) * s.B, C = 64.0, dd = static_cast<double>(d);
    const double flops = chunks * H * (7 * C * C * dd + 6 * C * C * dd + 18 * C * dd * dd);
    const double packed = time_ms([&] {
      kda_varlen_backward(gpu(), q, k, v, g, beta, scale, cu, s.T, d_out, dq, dk, dv, dg, db);
    });
    const double each = time_ms([&] {
      for (int64_t b = 0; b < s.B; ++b) {
        const int64_t r0 = b * s.T, r1 = r0 + s.T;
        kda_chunked_backward(gpu(), q.slice(0, r0, r1), k.slice(0, r0, r1), v.slice(0, r0, r1),
                             g.slice(0, r0, r1), beta.slice(0, r0, r1), scale, s0,
                             d_out.slice(0, r0, r1), Tensor(), dq.slice(0, r0, r1),
                             dk.slice(0, r0, r1), dv.slice(0, r0, r1), dg.slice(0, r0, r1),
                             db.slice(0, r0, r1), Tensor());
      }
    });
    std::printf(
        "KDABWD packed B=%lld T=%lld H=%lld d=%lld %.3f ms %.2f TFLOP/s (%.1f%% of f32); one call "
        "per sequence %.3f ms (%.1fx)\n",
        static_cast<long long>(s.B), static_cast<long long>(s.T), static_cast<long long>(H),
        static_cast<long long>(d), packed, flops / packed / 1e9,
        100 * flops / packed / 1e-3 / kF32Flops, each, each / packed);
    const std::string name = "kda_varlen_backward_f32_B" + std::to_string(s.B) + "_T" +
                             std::to_string(s.T) + "_H" + std::to_string(H) + "_d" +
                             std::to_string(d);
    emit_gpubench(name.c_str(), flops / packed / 1e9, "TFLOP/s", kF32Flops / 1e12, packed);
    std::fflush(stdout);
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
