// CUDA GEMM benchmarks (kernels/cuda/gemm.h): bf16-weight linear_forward at decode and prefill
// row counts, each of its kernels forced, the f32 path, and the batch-invariant kernels beside
// the default ones at the same shapes. CUDA events, median of many timed calls; before each
// start event a 256 MiB device copy runs (not timed), which evicts the weights from the 50 MB L2
// and keeps the GPU busy while the host enqueues the timed call (so launch latency is not timed).
// Timings of f32 x include its cast to bf16 where the kernel needs one.
//
// Ceilings measured in the same run: a 1 GiB device-to-device copy (bytes read + written, the
// practical bandwidth ceiling) and cublasGemmEx bf16 x bf16 -> bf16 (f32 compute) at
// 8192^3 (the practical bf16 tensor-core ceiling). Decode-sized rows (M <= 64) are reported as
// GB/s of weight bytes (N K 2 for bf16, N K 4 for f32) against the copy; larger M as TFLOP/s
// (2 M N K) against the GemmEx ceiling (bf16) or the 67 TFLOP/s f32 datasheet rate (f32).
// Prints "GPUBENCH <name> <achieved> <unit> <roofline> <fraction> <median ms>" lines for
// tests/gpu/run.sh, and one "GEMMROW <name> <ms> <TFLOP/s> <weight GB/s>" line per timing.
#include <cublas_v2.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm.h"
#include "kernels/gemm.h"
#include "tests/gpu/gpu_test_support.h"

namespace loom {
namespace {

constexpr double kHbmGBs = 4800.0;   // H200 HBM3e, datasheet
constexpr double kF32TFlops = 67.0;  // H100/H200 SXM plain f32, datasheet

const Exec& gpu() {
  static const Exec ex = cuda::device_exec(0);
  return ex;
}
Exec gpu_invariant() {
  Exec ex = gpu();
  ex.batch_invariant = true;
  return ex;
}
cudaStream_t stream() { return cuda::stream_of(gpu()); }

// Random values (timing does not depend on them, but zeros could take shortcuts).
Tensor random_host(Shape shape) {
  static std::mt19937 rng(12345);
  std::uniform_real_distribution<float> ud(-1.0f, 1.0f);
  Tensor h = Tensor::empty(shape);
  for (int64_t i = 0; i < h.numel(); ++i) h.data<float>()[i] = ud(rng);
  return h;
}
Tensor random_device(Shape shape, DType dtype = DType::kF32) {
  Tensor h = random_host(shape);
  if (dtype == DType::kBF16) {
    Tensor b = Tensor::empty(shape, DType::kBF16);
    for (int64_t i = 0; i < h.numel(); ++i) {
      b.data<uint16_t>()[i] = f32_to_bf16(h.data<float>()[i]);
    }
    h = b;
  }
  return cuda::to_device(h);
}

// The untimed copy before each timed call (see the top).
struct Pad {
  Tensor src, dst;
  void operator()() const {
    LOOM_CUDA_CHECK(
        cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToDevice, stream()));
  }
};
const Pad& pad() {
  static const Pad p{random_device({int64_t{64} << 20}),
                     Tensor::empty({int64_t{64} << 20}, DType::kF32, Device::kCuda)};
  return p;
}

double time_ms(const std::function<void()>& fn, int iters) {
  return median_event_ms(
      stream(), [&](int) { fn(); }, iters, 3, [] { pad()(); });
}

double g_copy_gbs = 0.0;     // this run's device copy
double g_bf16_tflops = 0.0;  // this run's cublasGemmEx bf16 8192^3

void bench_ceilings() {
  const int64_t n = int64_t{1} << 28;  // 1 GiB of f32
  Tensor a = random_device({n}), b = Tensor::empty({n}, DType::kF32, Device::kCuda);
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
  Tensor ab = random_device({s, s}, DType::kBF16);
  Tensor c = Tensor::empty({s, s}, DType::kBF16, Device::kCuda);
  const cublasHandle_t blas = cuda::device_context(0).blas;
  const float alpha = 1.0f, beta = 0.0f;
  const int si = static_cast<int>(s);
  const double gms = median_event_ms(
      stream(),
      [&](int) {
        const cublasStatus_t st =
            cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, si, si, si, &alpha, ab.raw(), CUDA_R_16BF,
                         si, ab.raw(), CUDA_R_16BF, si, &beta, c.raw(), CUDA_R_16BF, si,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS) {
          std::fprintf(stderr, "cublasGemmEx failed: %d\n", static_cast<int>(st));
          std::abort();
        }
      },
      10, 3);
  g_bf16_tflops = 2.0 * s * s * s / (gms * 1e9);
  emit_gpubench("cublasGemmEx_bf16_8192^3_ceiling", g_bf16_tflops, "TFLOP/s", 990.0, gms);
}

// One timing: a GEMMROW line, and a GPUBENCH line against the ceiling of its regime.
void report(const std::string& name, int64_t M, int64_t N, int64_t K, int weight_bytes, double ms,
            bool f32_math) {
  const double tflops = 2.0 * M * N * K / (ms * 1e9);
  const double gbs = static_cast<double>(weight_bytes) * N * K / (ms * 1e6);
  std::printf("GEMMROW %s %.4f %.1f %.1f\n", name.c_str(), ms, tflops, gbs);
  if (M <= 64) {
    emit_gpubench((name + "_weightGBs").c_str(), gbs, "GB/s", g_copy_gbs, ms);
  } else {
    emit_gpubench((name + "_TFLOPs").c_str(), tflops, "TFLOP/s",
                  f32_math ? kF32TFlops : g_bf16_tflops, ms);
  }
}

void bench_shape(int64_t N, int64_t K) {
  const std::string shape = "_N" + std::to_string(N) + "_K" + std::to_string(K);
  const Tensor wb = random_device({N, K}, DType::kBF16);
  const Tensor wf = random_device({N, K});
  for (int64_t M : {1, 2, 4, 8, 64, 512, 4096}) {
    const bool headline = M == 1 || M == 8 || M == 64 || M == 512 || M == 4096;
    const Tensor x = random_device({M, K});
    const Tensor out = Tensor::empty({M, N}, DType::kF32, Device::kCuda);
    const int iters = M >= 4096 ? 15 : 40;
    const std::string rows = "_M" + std::to_string(M) + shape;
    auto bf16 = [&](const char* what, cuda::Bf16Gemm kernel, const Exec& ex) {
      const double ms =
          time_ms([&] { cuda::linear_forward_bf16(ex, x, wb, out, 0.0f, kernel); }, iters);
      report(std::string("linear_bf16w_") + what + rows, M, N, K, 2, ms, false);
    };
    bf16("auto", cuda::Bf16Gemm::kAuto, gpu());
    if (M <= 8) bf16("gemv", cuda::Bf16Gemm::kGemv, gpu());
    bf16("cublaslt", cuda::Bf16Gemm::kCublasLt, gpu());
    if (!headline) continue;
    bf16("tiled", cuda::Bf16Gemm::kTiled, gpu());
    bf16("invariant", cuda::Bf16Gemm::kAuto, gpu_invariant());
    const double ms_f32 = time_ms([&] { linear_forward(gpu(), x, wf, out, 0.0f); }, iters);
    report("linear_f32w" + rows, M, N, K, 4, ms_f32, true);
    const double ms_f32i =
        time_ms([&] { linear_forward(gpu_invariant(), x, wf, out, 0.0f); }, iters);
    report("linear_f32w_invariant" + rows, M, N, K, 4, ms_f32i, true);
  }
  // The bf16 x bf16 GEMM alone at prefill size (bf16 activations: no cast).
  const int64_t M = 4096;
  const Tensor xb = random_device({M, K}, DType::kBF16);
  const Tensor out = Tensor::empty({M, N}, DType::kF32, Device::kCuda);
  const double ms = time_ms([&] { linear_forward(gpu(), xb, wb, out, 0.0f); }, 15);
  report("linear_bf16x_bf16w_M4096" + shape, M, N, K, 2, ms, false);
}

}  // namespace
// The decode GEMVs of the 48B-shaped model at batch 1 (bf16 x and out, as the engine runs them):
// KDA q/k/v fused (12288 x 2304), output projections (2304 x 4096), the shared expert's halves
// (1024 x 2304), its down (2304 x 1024), the KDA gates' low-rank halves (128 x 2304). Weights
// rotate through copies larger than L2 so that every call reads HBM.
void bench_gemv_decode() {
  struct S {
    int64_t N, K;
  };
  for (const S s : {S{12288, 2304}, S{2304, 4096}, S{1024, 2304}, S{2304, 1024}, S{128, 2304}}) {
    const int copies = static_cast<int>(std::max<int64_t>(2, 200'000'000 / (s.N * s.K * 2)));
    std::vector<Tensor> ws;
    for (int i = 0; i < copies; ++i) ws.push_back(random_device({s.N, s.K}, DType::kBF16));
    const Tensor x = random_device({1, s.K}, DType::kBF16);
    const Tensor out = Tensor::empty({1, s.N}, DType::kBF16, Device::kCuda);
    int i = 0;
    const double ms = time_ms(
        [&] {
          cuda::linear_forward_bf16(gpu(), x, ws[static_cast<size_t>(i++ % copies)], out, 0.0f,
                                    cuda::Bf16Gemm::kGemv);
        },
        200);
    report("gemv_decode_bf16x_M1_N" + std::to_string(s.N) + "_K" + std::to_string(s.K), 1, s.N, s.K,
           2, ms, false);
  }
}

}  // namespace loom

// `gemm_cuda_bench decode` times only the decode GEMVs (after the ceilings).
int main(int argc, char** argv) {
  loom::cuda::init();
  cudaDeviceProp prop{};
  LOOM_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, %.0f MB L2\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize / 1e6);
  loom::bench_ceilings();
  if (argc > 1 && std::string(argv[1]) == "decode") {
    loom::bench_gemv_decode();
    return 0;
  }
  loom::bench_shape(4096, 4096);
  loom::bench_shape(2048, 7168);
  loom::bench_gemv_decode();
  return 0;
}
