// CUDA FP8-weight linear layers (kernels/cuda/gemm_fp8.h) beside bf16 weights in the same run:
// decode rows as weight GB/s against a device copy, prefill rows as TFLOP/s against cuBLASLt's
// plain FP8 GEMM (one tensor-wide scale per operand, e4m3 x e4m3 -> bf16, f32 compute) measured
// here. Each of linear_forward_fp8's kernels is also forced (the GEMV up to 64 rows, the
// quantize + block-scaled cuBLASLt path for a multiple of 4 rows, the dequantize-to-bf16 path from
// 8 rows), so kFp8GemvAutoRows and kFp8PrefillKernel can be read off. Activations bf16 (what the
// GPU serves with), outputs bf16. CUDA events, median of many timed calls, each after an untimed
// 256 MiB device copy that evicts the weights from the 50 MB L2 (tests/gpu/gemm_cuda_bench.cc does
// the same). Prints "GPUBENCH <name> <achieved> <unit> <roofline> <fraction> <median ms>" lines for
// tests/gpu/run.sh and "FP8ROW <name> <ms> <TFLOP/s> <weight GB/s>" per timing.
#include <cublasLt.h>
#include <cublas_v2.h>

#include <cstdio>
#include <functional>
#include <random>
#include <string>

#include "core/workspace.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemm_fp8.h"
#include "kernels/cuda/gemm_fp8_launch.h"
#include "kernels/gemm.h"
#include "tests/gpu/cublaslt_fp8_plain.h"
#include "tests/gpu/fp8_test_support.h"
#include "tests/gpu/gpu_test_support.h"

namespace loom {
namespace {

constexpr double kHbmGBs = 4800.0;        // H200 HBM3e, datasheet
constexpr double kFp8DenseTFlops = 1979;  // H200 SXM FP8 dense, datasheet

// With a workspace, as the engine runs linear_forward: the dequantize-to-bf16 path takes its copy
// from it instead of allocating one per call.
const Exec& gpu() {
  static Workspace ws(Device::kCuda, size_t{1} << 30);
  static const Exec ex = cuda::device_exec(0, &ws);
  return ex;
}
cudaStream_t stream() { return cuda::stream_of(gpu()); }
std::mt19937_64& rng() {
  static std::mt19937_64 r(12345);
  return r;
}

Tensor random_device(Shape shape, DType dtype) {
  std::uniform_real_distribution<float> ud(-1.0f, 1.0f);
  Tensor h = Tensor::empty(shape, dtype);
  for (int64_t i = 0; i < h.numel(); ++i) {
    const float v = ud(rng());
    if (dtype == DType::kBF16) {
      h.data<uint16_t>()[i] = f32_to_bf16(v);
    } else if (dtype == DType::kF8E4M3) {
      static_cast<uint8_t*>(h.raw())[i] = f32_to_f8e4m3(v * 400.0);
    } else {
      h.data<float>()[i] = v;
    }
  }
  return cuda::to_device(h);
}

struct Pad {
  Tensor src, dst;
  void operator()() const {
    LOOM_CUDA_CHECK(
        cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToDevice, stream()));
  }
};
const Pad& pad() {
  static const Pad p{random_device({int64_t{64} << 20}, DType::kF32),
                     Tensor::empty({int64_t{64} << 20}, DType::kF32, Device::kCuda)};
  return p;
}
double time_ms(const std::function<void()>& fn, int iters) {
  return median_event_ms(
      stream(), [&](int) { fn(); }, iters, 3, [] { pad()(); });
}

double g_copy_gbs = 0.0;     // this run's device copy
double g_fp8_tflops = 0.0;   // this run's plain FP8 cuBLASLt 8192^3
double g_bf16_tflops = 0.0;  // this run's bf16 linear_forward 8192^3

void bench_ceilings() {
  const int64_t n = int64_t{1} << 28;  // 1 GiB of f32
  Tensor a = random_device({n}, DType::kF32), b = Tensor::empty({n}, DType::kF32, Device::kCuda);
  const double ms = median_event_ms(
      stream(),
      [&](int) {
        LOOM_CUDA_CHECK(
            cudaMemcpyAsync(b.raw(), a.raw(), a.nbytes(), cudaMemcpyDeviceToDevice, stream()));
      },
      20, 3);
  g_copy_gbs = 2.0 * a.nbytes() / (ms * 1e6);
  emit_gpubench("d2d_copy_1GiB_read+write", g_copy_gbs, "GB/s", kHbmGBs, ms);

  const int64_t s = 8192;
  const Tensor w8 = random_device({s, s}, DType::kF8E4M3),
               x8 = random_device({s, s}, DType::kF8E4M3);
  Tensor out = Tensor::empty({s, s}, DType::kBF16, Device::kCuda);
  const fp8bench::PlainFp8 plain(s, s, s);
  const double fms = median_event_ms(
      stream(), [&](int) { plain.run(w8.raw(), x8.raw(), out.raw(), stream()); }, 10, 3);
  g_fp8_tflops = 2.0 * s * s * s / (fms * 1e9);
  emit_gpubench("cublaslt_fp8_plain_8192^3_ceiling", g_fp8_tflops, "TFLOP/s", kFp8DenseTFlops, fms);

  const Tensor wb = random_device({s, s}, DType::kBF16), xb = random_device({s, s}, DType::kBF16);
  const double bms = median_event_ms(
      stream(), [&](int) { linear_forward(gpu(), xb, wb, out, 0.0f); }, 10, 3);
  g_bf16_tflops = 2.0 * s * s * s / (bms * 1e9);
  emit_gpubench("linear_bf16_8192^3", g_bf16_tflops, "TFLOP/s", g_fp8_tflops, bms);
}

void report(const std::string& name, int64_t M, int64_t N, int64_t K, int weight_bytes, double ms) {
  const double tflops = 2.0 * M * N * K / (ms * 1e9);
  const double gbs = static_cast<double>(weight_bytes) * N * K / (ms * 1e6);
  std::printf("FP8ROW %s %.4f %.1f %.1f\n", name.c_str(), ms, tflops, gbs);
  if (M <= 64) {
    emit_gpubench((name + "_weightGBs").c_str(), gbs, "GB/s", g_copy_gbs, ms);
  } else {
    emit_gpubench((name + "_TFLOPs").c_str(), tflops, "TFLOP/s", g_fp8_tflops, ms);
  }
}

void bench_shape(int64_t N, int64_t K) {
  const std::string shape = "_N" + std::to_string(N) + "_K" + std::to_string(K);
  const Tensor w8 = fp8test::fp8_to_device(fp8test::random_fp8_matrix(rng(), N, K));
  const Tensor wb = random_device({N, K}, DType::kBF16);
  for (const int64_t M : {1, 2, 4, 8, 12, 16, 32, 64, 512, 4096}) {
    const Tensor x = random_device({M, K}, DType::kBF16);
    const Tensor out = Tensor::empty({M, N}, DType::kBF16, Device::kCuda);
    const int iters = M >= 4096 ? 15 : 40;
    const std::string rows = "_M" + std::to_string(M) + shape;
    auto fp8 = [&](const char* what, cuda::Fp8Gemm kernel) {
      bool ran = true;
      const double ms = time_ms(
          [&] { ran = cuda::linear_forward_fp8(gpu(), x, w8, out, 0.0f, kernel) && ran; }, iters);
      if (!ran) {
        std::printf("FP8ROW linear_fp8w_%s%s refused by cuBLASLt\n", what, rows.c_str());
        return;
      }
      report(std::string("linear_fp8w_") + what + rows, M, N, K, 1, ms);
    };
    fp8("auto", cuda::Fp8Gemm::kAuto);
    if (M <= 64) fp8("gemv", cuda::Fp8Gemm::kGemv);
    if (M % 4 == 0) fp8("blockscaled", cuda::Fp8Gemm::kBlockScaled);
    if (M >= 8) fp8("dequantbf16", cuda::Fp8Gemm::kDequantBf16);
    const double bms = time_ms([&] { linear_forward(gpu(), x, wb, out, 0.0f); }, iters);
    report("linear_bf16w" + rows, M, N, K, 2, bms);
    if (M >= 64) {
      // The plain FP8 GEMM on already-quantized x (no quantization pass, no block scales), and
      // the quantization pass alone.
      const Tensor xq = random_device({M, K}, DType::kF8E4M3);
      const fp8bench::PlainFp8 plain(M, N, K);
      const double pms =
          time_ms([&] { plain.run(w8.raw(), xq.raw(), out.raw(), stream()); }, iters);
      report("cublaslt_fp8_plain" + rows, M, N, K, 1, pms);
      Tensor q = Tensor::empty({M, K}, DType::kU8, Device::kCuda);
      Tensor s = Tensor::empty({(K + 127) / 128, M}, DType::kF32, Device::kCuda);
      const double qms = time_ms(
          [&] {
            cuda::launch::quantize_fp8_groups(stream(), x.raw(), cuda::launch::Elem::kBF16, M, K,
                                              static_cast<uint8_t*>(q.raw()), s.data<float>());
          },
          iters);
      // Bytes moved: x (bf16) read, q written, the scales.
      std::printf("FP8ROW quantize_fp8_groups%s %.4f GB/s %.1f\n", rows.c_str(), qms,
                  (3.0 * M * K + 4.0 * M * ((K + 127) / 128)) / (qms * 1e6));
    }
  }
}

}  // namespace
}  // namespace loom

int main() {
  loom::cuda::init();
  cudaDeviceProp prop{};
  LOOM_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, %.0f MB L2\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize / 1e6);
  loom::bench_ceilings();
  loom::bench_shape(7168, 2048);
  loom::bench_shape(2048, 7168);
  loom::bench_shape(576, 7168);
  return 0;
}
