// CUDA kernel benchmarks with CUDA events (median of many timed launches after warm-up), each
// next to its H200 roofline: HBM3e 4.8 TB/s (datasheet; the measured device-to-device copy is
// printed too) and plain f32 (non-tensor-core) 67 TFLOP/s (datasheet, H200.md). Inputs are random
// (never zeros) and rotated among several buffers where one set would fit in the 60 MB L2.
// Prints "GPUBENCH <name> <achieved> <unit> <roofline> <fraction> <median ms>" lines for
// tests/gpu/run.sh.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/device.h"
#include "kernels/gemm.h"
#include "kernels/kda.h"
#include "kernels/norm.h"

namespace loom {
namespace {

constexpr double kHbmGBs = 4800.0;   // H200 HBM3e, datasheet
constexpr double kF32TFlops = 67.0;  // H100/H200 SXM plain f32, datasheet

Tensor random_device(Shape shape, float scale = 1.0f) {
  static std::mt19937 rng(12345);
  Tensor h = Tensor::empty(shape);
  std::normal_distribution<float> nd(0.0f, scale);
  for (int64_t i = 0; i < h.numel(); ++i) h.data<float>()[i] = nd(rng);
  return cuda::to_device(h);
}

// Median milliseconds of `iters` launches of fn(i), each bracketed by events on the device stream.
const Exec& gpu() {
  static const Exec ex = cuda::device_exec(0);
  return ex;
}

double median_ms(const std::function<void(int)>& fn, int iters, int warmup = 3) {
  for (int i = 0; i < warmup; ++i) fn(i);
  cuda::synchronize();
  cudaEvent_t a, b;
  LOOM_CUDA_CHECK(cudaEventCreate(&a));
  LOOM_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    LOOM_CUDA_CHECK(cudaEventRecord(a, cuda::stream_of(gpu())));
    fn(i);
    LOOM_CUDA_CHECK(cudaEventRecord(b, cuda::stream_of(gpu())));
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

void emit(const std::string& name, double achieved, const char* unit, double roof, double ms) {
  std::printf("GPUBENCH %s %.1f %s %.1f %.3f %.4f\n", name.c_str(), achieved, unit, roof,
              achieved / roof, ms);
  std::fflush(stdout);
}

void bench_copy() {
  const int64_t n = int64_t{1} << 28;  // 1 GiB of f32
  Tensor a = random_device({n}), b = Tensor::empty({n}, DType::kF32, Device::kCuda);
  const double ms = median_ms(
      [&](int) {
        LOOM_CUDA_CHECK(cudaMemcpyAsync(b.raw(), a.raw(), a.nbytes(), cudaMemcpyDeviceToDevice,
                                        cuda::stream_of(gpu())));
      },
      20);
  emit("d2d_copy_1GiB_read+write", 2.0 * a.nbytes() / (ms * 1e6), "GB/s", kHbmGBs, ms);
}

void bench_rmsnorm() {
  const int64_t N = 16384, D = 4096;  // 256 MiB in, 256 MiB out
  Tensor x = random_device({N, D}), w = random_device({D});
  Tensor out = Tensor::empty({N, D}, DType::kF32, Device::kCuda);
  const double ms = median_ms([&](int) { rmsnorm_forward(gpu(), x, w, 1e-6f, 0.0f, out); }, 30);
  const double bytes = 2.0 * N * D * 4 + D * 4;
  emit("rmsnorm_N16384_D4096", bytes / (ms * 1e6), "GB/s", kHbmGBs, ms);
}

void bench_gemm() {
  {
    const int64_t M = 2048, K = 4096, N = 4096;
    Tensor x = random_device({M, K}), w = random_device({N, K}, 0.02f);
    Tensor out = Tensor::empty({M, N}, DType::kF32, Device::kCuda);
    const double ms = median_ms([&](int) { linear_forward(gpu(), x, w, out, 0.0f); }, 20);
    emit("linear_f32_M2048_K4096_N4096", 2.0 * M * N * K / (ms * 1e9), "TFLOP/s", kF32TFlops, ms);
  }
  {
    // Decode: M = 1 is a matrix-vector product, bound by reading the 64 MiB weight; 8 weights
    // (512 MiB) rotate so that L2 never holds the next one.
    const int64_t K = 4096, N = 4096, sets = 8;
    std::vector<Tensor> ws;
    for (int i = 0; i < sets; ++i) ws.push_back(random_device({N, K}, 0.02f));
    Tensor x = random_device({1, K});
    Tensor out = Tensor::empty({1, N}, DType::kF32, Device::kCuda);
    const double ms =
        median_ms([&](int i) { linear_forward(gpu(), x, ws[i % sets], out, 0.0f); }, 40);
    const double bytes = 4.0 * (N * K + K + N);
    emit("linear_f32_M1_K4096_N4096_weight_bytes", bytes / (ms * 1e6), "GB/s", kHbmGBs, ms);
    emit("linear_f32_M1_K4096_N4096_flops", 2.0 * N * K / (ms * 1e9), "TFLOP/s", kF32TFlops, ms);
  }
}

// One decode token (T = 1) of the KDA recurrence: the state is read and written once, so the
// bytes are 2 * Hv * dk * dv * 4 plus the (tiny) q, k, v, g, beta and out.
void bench_kda_decode(int64_t Hv, int64_t sets) {
  const int64_t Hk = Hv, dk = 128, dv = 128, T = 1;
  std::vector<Tensor> states;
  for (int i = 0; i < sets; ++i) states.push_back(random_device({Hv, dk, dv}, 0.1f));
  Tensor q = random_device({T, Hk, dk}, 0.09f), k = random_device({T, Hk, dk}, 0.09f);
  Tensor v = random_device({T, Hv, dv}), g = random_device({T, Hv, dk}, 0.01f);
  Tensor beta = random_device({T, Hv}, 0.3f);
  // g must be <= 0 and beta in (0, 1) only for the maths; timing does not depend on the values.
  Tensor out = Tensor::empty({T, Hv, dv}, DType::kF32, Device::kCuda);
  const double ms = median_ms(
      [&](int i) { kda_recurrent_forward(gpu(), q, k, v, g, beta, 0.088f, states[i % sets], out); },
      50);
  const double bytes = 2.0 * Hv * dk * dv * 4 + 4.0 * T * (2 * Hk * dk + Hv * (2 * dv + dk + 1));
  emit("kda_recurrent_decode_Hv" + std::to_string(Hv) + "_dk128_dv128_state_bytes",
       bytes / (ms * 1e6), "GB/s", kHbmGBs, ms);
}

}  // namespace
}  // namespace loom

int main() {
  loom::cuda::init();
  cudaDeviceProp prop{};
  LOOM_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, %.0f MB L2\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize / 1e6);
  loom::bench_copy();
  loom::bench_rmsnorm();
  loom::bench_gemm();
  loom::bench_kda_decode(32, 64);  // 4 MiB of state per call, 256 MiB rotated
  loom::bench_kda_decode(256, 8);  // 8 sequences' worth of heads in one launch, 256 MiB rotated
  return 0;
}
