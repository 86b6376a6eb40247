// The grouped SwiGLU with FP8 expert weights (kernels/cuda/moe_fp8.cu) beside bf16 weights in the
// same run, at the 48B-shaped model's routed experts (Kimi-Linear-48B: E 256, D 2304, I 1024,
// top-8), bf16 activations (the model's), with a device workspace (as the engine runs it):
//  - decode, T = 1 to 64 tokens (T * 8 rows spread evenly over the experts): weight GB/s of the
//    touched experts (FP8: 1 byte per weight plus the scales; bf16: 2) against this run's device
//    copy, whose rate also gives each shape's ceiling, time >= bytes / copy rate;
//  - prefill, T = 256, 4096, 16384, 131072 (8, 128, 512, 4096 rows per expert): TFLOP/s (6 R D I)
//    of each path against this run's peaks: cuBLASLt's plain FP8 GEMM at 8192^3
//    (tests/gpu/cublaslt_fp8_plain.h, as gemm_fp8_cuda_bench measures it) for the FP8 weights,
//    cuBLAS's bf16 GEMM at 8192^3 for bf16 weights and the FP8 copies (which run on the bf16
//    tensor cores); the ceiling is the larger of FLOPs / that peak and the weight bytes / the copy
//    rate. The block-scaled FP8 path (wgmma_fp8) also runs each of its three launches alone
//    (x's quantization, the gate/up GEMM with h's quantization, the down GEMM), the GEMMs' TFLOP/s
//    against the FP8 peak.
// Each FP8 shape runs kAuto and its paths forced (gemv up to 256 tokens; the copies on wgmma;
// wgmma_fp8), so the row counts where kAuto should switch can be read off. A 256 MiB device copy
// before each timed call evicts the weights from the 50 MB L2. Prints "GPUBENCH <name> <achieved>
// <unit> <roofline> <fraction> <median ms>" and "MOEFP8 <name> <ms> <ceiling ms>" lines.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/allocator.h"
#include "core/dtype.h"
#include "core/fp8_matrix.h"
#include "core/workspace.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/moe.h"
#include "tests/gpu/cublaslt_fp8_plain.h"
#include "tests/gpu/gpu_test_support.h"

namespace loom {
namespace {

constexpr int64_t kE = 256, kD = 2304, kI = 1024, kTopK = 8;

const Exec& gpu() {
  static Workspace ws(Device::kCuda, size_t{5} << 30);  // 131072 tokens: 3.6 GB on wgmma_fp8
  static const Exec ex = cuda::device_exec(0, &ws);
  return ex;
}
cudaStream_t stream() { return cuda::stream_of(gpu()); }

// `bytes` of device memory filled by repeating a host block of random bytes from `gen`.
template <typename Gen>
void fill_repeating(void* dst, size_t bytes, Gen gen) {
  std::vector<uint8_t> block(size_t{1} << 22);
  for (uint8_t& b : block) b = gen();
  for (size_t o = 0; o < bytes; o += block.size()) {
    LOOM_CUDA_CHECK(cudaMemcpy(static_cast<char*>(dst) + o, block.data(),
                               std::min(block.size(), bytes - o), cudaMemcpyHostToDevice));
  }
}

std::mt19937& rng() {
  static std::mt19937 r(12345);
  return r;
}

// A device FP8 stack [E, N, K] as the arena lays one out: random finite e4m3 codes, scales
// 2^-9..2^-8 (values of N(0, 0.02)-like weights).
Tensor fp8_experts(int64_t E, int64_t N, int64_t K) {
  const Shape shape{E, N, K};
  std::shared_ptr<void> mem = allocate_buffer(fp8_storage_bytes(shape), Device::kCuda);
  std::normal_distribution<float> nd(0.0f, 100.0f);
  fill_repeating(mem.get(), static_cast<size_t>(shape.numel()),
                 [&] { return f32_to_f8e4m3(std::clamp(nd(rng()), -448.0f, 448.0f)); });
  const Tensor t = Tensor::wrap(mem.get(), shape, DType::kF8E4M3, Device::kCuda, mem);
  const Tensor s = fp8_matrix_scales(t);
  std::vector<float> scales(static_cast<size_t>(s.numel()));
  std::uniform_real_distribution<float> ud(1.0f / 512, 1.0f / 256);
  for (float& v : scales) v = ud(rng());
  LOOM_CUDA_CHECK(cudaMemcpy(s.raw(), scales.data(), scales.size() * 4, cudaMemcpyHostToDevice));
  return t;
}

// A device bf16 tensor of N(0, 0.02) values (repeating every 2^21 of them).
Tensor random_bf16(const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::kBF16, Device::kCuda);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  bool hi = false;
  uint16_t cur = 0;
  fill_repeating(t.raw(), t.nbytes(), [&]() -> uint8_t {
    hi = !hi;
    if (hi) cur = f32_to_bf16(nd(rng()));
    return hi ? static_cast<uint8_t>(cur & 0xff) : static_cast<uint8_t>(cur >> 8);
  });
  return t;
}

Tensor device_i32(const std::vector<int32_t>& v) {
  Tensor h = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI32);
  std::copy(v.begin(), v.end(), h.data<int32_t>());
  return cuda::to_device(h);
}

double g_copy_gbs = 0.0, g_bf16_tflops = 0.0, g_fp8_tflops = 0.0;

void bench_ceilings() {
  const int64_t n = int64_t{1} << 28;
  Tensor a = Tensor::empty({n}, DType::kF32, Device::kCuda);
  Tensor b = Tensor::empty({n}, DType::kF32, Device::kCuda);
  LOOM_CUDA_CHECK(cudaMemset(a.raw(), 1, a.nbytes()));
  const double ms = median_event_ms(
      stream(),
      [&](int) {
        LOOM_CUDA_CHECK(
            cudaMemcpyAsync(b.raw(), a.raw(), a.nbytes(), cudaMemcpyDeviceToDevice, stream()));
      },
      10, 2);
  g_copy_gbs = 2.0 * a.nbytes() / (ms * 1e6);
  emit_gpubench("copy_1GiB", g_copy_gbs, "GB/s", g_copy_gbs, ms);
  const int s = 8192;
  Tensor x = random_bf16({s, s}), w = random_bf16({s, s});
  Tensor c = Tensor::empty({s, s}, DType::kBF16, Device::kCuda);
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) std::abort();
  cublasSetStream(h, stream());
  const float one = 1.0f, zero = 0.0f;
  const double gms = median_event_ms(
      stream(),
      [&](int) {
        cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s, s, s, &one, w.raw(), CUDA_R_16BF, s, x.raw(),
                     CUDA_R_16BF, s, &zero, c.raw(), CUDA_R_16BF, s, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT);
      },
      10, 2);
  cublasDestroy(h);
  g_bf16_tflops = 2.0 * s * double{s} * s / (gms * 1e9);
  emit_gpubench("cublas_bf16_8192^3", g_bf16_tflops, "TFLOP/s", g_bf16_tflops, gms);
  // The FP8 peak, on random finite e4m3 codes as the experts hold.
  std::normal_distribution<float> nd(0.0f, 100.0f);
  const auto e4m3 = [&] { return f32_to_f8e4m3(std::clamp(nd(rng()), -448.0f, 448.0f)); };
  Tensor x8 = Tensor::empty({s, s}, DType::kU8, Device::kCuda);
  Tensor w8 = Tensor::empty({s, s}, DType::kU8, Device::kCuda);
  fill_repeating(x8.raw(), x8.nbytes(), e4m3);
  fill_repeating(w8.raw(), w8.nbytes(), e4m3);
  const fp8bench::PlainFp8 plain(s, s, s);
  const double fms = median_event_ms(
      stream(), [&](int) { plain.run(w8.raw(), x8.raw(), c.raw(), stream()); }, 10, 3);
  g_fp8_tflops = 2.0 * s * double{s} * s / (fms * 1e9);
  emit_gpubench("cublaslt_fp8_plain_8192^3", g_fp8_tflops, "TFLOP/s", g_fp8_tflops, fms);
}

struct Weights {
  Tensor g8, u8, d8, gb, ub, db;
};

void bench_tokens(const Weights& w, int64_t T) {
  const int64_t R = T * kTopK;
  std::vector<int32_t> off(static_cast<size_t>(kE + 1));
  int64_t touched = 0;
  for (int64_t e = 0; e <= kE; ++e) off[e] = static_cast<int32_t>(e * R / kE);
  for (int64_t e = 0; e < kE; ++e) touched += off[e + 1] > off[e];
  const Tensor offd = device_i32(off);
  const Tensor x = random_bf16({R, kD});
  Tensor y = Tensor::empty({R, kD}, DType::kBF16, Device::kCuda);
  static Tensor pad_src = Tensor::empty({int64_t{64} << 20}, DType::kF32, Device::kCuda);
  static Tensor pad_dst = Tensor::empty({int64_t{64} << 20}, DType::kF32, Device::kCuda);
  const auto pad = [] {
    LOOM_CUDA_CHECK(cudaMemcpyAsync(pad_dst.raw(), pad_src.raw(), pad_src.nbytes(),
                                    cudaMemcpyDeviceToDevice, stream()));
  };
  const double weights = 3.0 * kI * kD;  // per expert
  const double scales = 3.0 * ((kI + 127) / 128) * ((kD + 127) / 128) * 4;
  const double flops = 6.0 * R * kD * kI;
  const bool prefill = T >= 256;
  const int iters = T >= 16384 ? 5 : T >= 4096 ? 8 : 20;
  const std::string shape = "_T" + std::to_string(T) + "_E256_D2304_I1024";
  const auto time = [&](const char* path, bool fp8, int phases) {
    std::string ran;
    const double ms = median_event_ms(
        stream(),
        [&](int) {
          ran = cuda::moe_grouped_swiglu_on(gpu(), path, x, offd, fp8 ? w.g8 : w.gb,
                                            fp8 ? w.u8 : w.ub, fp8 ? w.d8 : w.db, y, Tensor(),
                                            phases);
        },
        iters, 2, pad);
    return std::make_pair(ms, ran);
  };
  const auto one = [&](const char* path, bool fp8) {
    const auto [ms, ran] = time(path, fp8, 7);
    const double bytes = touched * (fp8 ? weights + scales : 2 * weights);
    // The FP8 copies run on the bf16 tensor cores: bf16's peak is theirs.
    const double peak = fp8 && ran == "wgmma_fp8" ? g_fp8_tflops : g_bf16_tflops;
    const double ceiling =
        std::max(bytes / (g_copy_gbs * 1e6), prefill ? flops / (peak * 1e9) : 0.0);
    const std::string name =
        std::string("moe_swiglu_") + (fp8 ? "fp8w_" : "bf16w_") + path + "(" + ran + ")" + shape;
    if (prefill) {
      emit_gpubench((name + "_TFLOPs").c_str(), flops / (ms * 1e9), "TFLOP/s", peak, ms);
      if (fp8) {
        std::printf("MOEFP8PEAK %s %.1f TFLOP/s = %.3f of the FP8 peak %.1f\n", name.c_str(),
                    flops / (ms * 1e9), flops / (ms * 1e9) / g_fp8_tflops, g_fp8_tflops);
      }
    } else {
      emit_gpubench((name + "_weightGBs").c_str(), bytes / (ms * 1e6), "GB/s", g_copy_gbs, ms);
    }
    std::printf("MOEFP8 %s %.4f %.4f\n", name.c_str(), ms, ceiling);
  };
  one("auto", true);
  if (T <= 256) one("gemv", true);
  one("wgmma", true);
  one("wgmma_fp8", true);
  one("auto", false);
  if (!prefill) return;
  // wgmma_fp8's launches alone (each reads what the previous call left in the workspace).
  const double up_flops = 4.0 * R * kD * kI, down_flops = 2.0 * R * kD * kI;
  const double qms = time("wgmma_fp8", true, 1).first;
  const double ums = time("wgmma_fp8", true, 2).first;
  const double dms = time("wgmma_fp8", true, 4).first;
  emit_gpubench(("moe_fp8_block_quantize_x" + shape + "_GBs").c_str(),
                R * kD * (2.0 + 1.0) / (qms * 1e6), "GB/s", g_copy_gbs, qms);
  emit_gpubench(("moe_fp8_block_gate_up" + shape + "_TFLOPs").c_str(), up_flops / (ums * 1e9),
                "TFLOP/s", g_fp8_tflops, ums);
  emit_gpubench(("moe_fp8_block_down" + shape + "_TFLOPs").c_str(), down_flops / (dms * 1e9),
                "TFLOP/s", g_fp8_tflops, dms);
  std::printf(
      "MOEFP8PHASES T%lld quantize %.4f ms, gate/up %.4f ms (%.1f TFLOP/s, %.3f of peak), "
      "down %.4f ms (%.1f TFLOP/s, %.3f), GEMMs together %.1f TFLOP/s = %.3f of the FP8 "
      "peak %.1f\n",
      static_cast<long long>(T), qms, ums, up_flops / (ums * 1e9),
      up_flops / (ums * 1e9) / g_fp8_tflops, dms, down_flops / (dms * 1e9),
      down_flops / (dms * 1e9) / g_fp8_tflops, flops / ((ums + dms) * 1e9),
      flops / ((ums + dms) * 1e9) / g_fp8_tflops, g_fp8_tflops);
  std::fflush(stdout);
}

}  // namespace
}  // namespace loom

int main() {
  using namespace loom;
  cuda::init();
  cudaDeviceProp prop{};
  LOOM_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (%d SMs)\n", prop.name, prop.multiProcessorCount);
  bench_ceilings();
  const Weights w{fp8_experts(kE, kI, kD),   fp8_experts(kE, kI, kD),   fp8_experts(kE, kD, kI),
                  random_bf16({kE, kI, kD}), random_bf16({kE, kI, kD}), random_bf16({kE, kD, kI})};
  // LOOM_BENCH_TOKENS: a comma-separated subset of the token counts.
  std::vector<int64_t> tokens = {1, 8, 64, 256, 4096, 16384, 131072};
  if (const char* only = std::getenv("LOOM_BENCH_TOKENS")) {
    tokens.clear();
    for (const char* p = only; *p;) {
      tokens.push_back(std::strtoll(p, nullptr, 10));
      while (*p && *p != ',') ++p;
      if (*p) ++p;
    }
  }
  for (const int64_t T : tokens) bench_tokens(w, T);
  return 0;
}
