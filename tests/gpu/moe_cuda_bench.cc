// MoE forward benchmarks on the GPU with CUDA events (median of many timed calls after warm-up),
// each next to a roofline measured in the same run:
//  - the grouped SwiGLU (bf16 weights, Kimi-like D = 2048, I = 768 per expert, 64 local experts,
//    512, 1024 and 2048 rows per expert, and a skewed routing of 512 on average) in TFLOP/s (2 R D
//    I 3 FLOP: gate, up, down) against cuBLAS's bf16 GEMM (cublasGemmEx 8192^3, bf16 in and out,
//    f32 compute), per GEMM path; its decode shape (a few rows per expert: every expert's weights
//    streamed once) in GB/s of weights against the run's device-to-device copy; and each path's
//    launches one by one (the x cast in GB/s, the gate/up and down GEMMs in TFLOP/s);
//  - routing, permute and combine in GB/s of their compulsory traffic against the copy.
// The grouped SwiGLU (kWgmma and the decode shapes), permute and combine run with f32 activations
// and again with bf16 ones (x, y, the permuted rows and the combined output bf16: the model's;
// "_bf16act" in the name), side by side.
// Inputs are random (never zeros); buffers larger than the 60 MB L2 make each call stream from HBM.
// The ops run with a device workspace, as the engine runs them.
// Prints "GPUBENCH <name> <achieved> <unit> <roofline> <fraction> <median ms>" lines for
// tests/gpu/run.sh.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/workspace.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/moe.h"
#include "kernels/moe.h"
#include "tests/gpu/gpu_test_support.h"

namespace loom {
namespace {

// The ops' temporaries come from a device workspace, as in the engine (without one, each call's
// stream-ordered allocation would show in its time).
const Exec& gpu() {
  static Workspace ws(Device::kCuda, size_t{1} << 30);
  static const Exec ex = cuda::device_exec(0, &ws);
  return ex;
}
cudaStream_t stream() { return cuda::stream_of(gpu()); }

double median_ms(const std::function<void(int)>& fn, int iters, int warmup = 3) {
  return median_event_ms(stream(), fn, iters, warmup);
}

// A device tensor of `shape` filled with a repeating block of 2^22 random values (normal, scale
// `scale`), f32 or bf16: quick to make at any size, and never all zeros.
Tensor random_device(Shape shape, float scale = 1.0f, DType dtype = DType::kF32) {
  static std::mt19937 rng(12345);
  const int64_t block = int64_t{1} << 22;
  std::normal_distribution<float> nd(0.0f, scale);
  Tensor t = Tensor::empty(shape, dtype, Device::kCuda);
  const int64_t n = t.numel();
  Tensor h = Tensor::empty({std::min(block, std::max<int64_t>(n, 1))}, dtype);
  for (int64_t i = 0; i < h.numel(); ++i) {
    const float v = nd(rng);
    if (dtype == DType::kBF16) {
      h.data<uint16_t>()[i] = f32_to_bf16(v);
    } else {
      h.data<float>()[i] = v;
    }
  }
  const size_t es = dtype_size(dtype);
  for (int64_t i = 0; i < n; i += h.numel()) {
    const int64_t m = std::min(h.numel(), n - i);
    LOOM_CUDA_CHECK(
        cudaMemcpy(static_cast<char*>(t.raw()) + i * es, h.raw(), m * es, cudaMemcpyHostToDevice));
  }
  return t;
}

Tensor device_i32(const std::vector<int32_t>& v, Shape shape) {
  Tensor h = Tensor::empty(shape, DType::kI32);
  std::copy(v.begin(), v.end(), h.data<int32_t>());
  return cuda::to_device(h);
}

double g_copy_gbs = 0.0;                    // this run's device-to-device copy
double g_cublas_tfs = 0.0;                  // this run's cuBLAS bf16 GEMM
constexpr double kHbmGBs = 4800.0;          // H200 HBM3e, datasheet
constexpr double kBf16DenseTFlops = 989.0;  // H100/H200 SXM dense bf16, datasheet

void bench_copy() {
  const int64_t n = int64_t{1} << 28;  // 1 GiB of f32
  Tensor a = random_device({n}), b = Tensor::empty({n}, DType::kF32, Device::kCuda);
  const double ms = median_ms(
      [&](int) {
        LOOM_CUDA_CHECK(
            cudaMemcpyAsync(b.raw(), a.raw(), a.nbytes(), cudaMemcpyDeviceToDevice, stream()));
      },
      20);
  g_copy_gbs = 2.0 * a.nbytes() / (ms * 1e6);
  emit_gpubench("d2d_copy_1GiB_read+write", g_copy_gbs, "GB/s", kHbmGBs, ms);
}

void bench_cublas() {
  const int n = 8192;
  Tensor a = random_device({n, n}, 1.0f, DType::kBF16),
         b = random_device({n, n}, 1.0f, DType::kBF16);
  Tensor c = Tensor::empty({n, n}, DType::kBF16, Device::kCuda);
  cublasHandle_t handle;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
    std::printf("cublasCreate failed\n");
    std::exit(1);
  }
  cublasSetStream(handle, stream());
  const float alpha = 1.0f, beta = 0.0f;
  const double ms = median_ms(
      [&](int) {
        const cublasStatus_t st =
            cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &alpha, b.raw(), CUDA_R_16BF, n,
                         a.raw(), CUDA_R_16BF, n, &beta, c.raw(), CUDA_R_16BF, n,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS) {
          std::printf("cublasGemmEx failed: %d\n", static_cast<int>(st));
          std::exit(1);
        }
      },
      20);
  cublasDestroy(handle);
  g_cublas_tfs = 2.0 * n * n * double{n} / (ms * 1e9);
  emit_gpubench("cublas_bf16_gemm_8192^3_f32_compute", g_cublas_tfs, "TFLOP/s", kBf16DenseTFlops,
                ms);
}

// Rows per expert: `rows` each (balanced), or (rows < 0) a skewed routing of 512 rows per expert
// on average: lognormal weights (sigma 0.7, a fixed seed), as a router's load imbalance gives
// (here 132 to 1350 rows: 0.26x to 2.6x the mean).
std::vector<int32_t> expert_rows(int64_t E, int64_t rows) {
  std::vector<int32_t> n(static_cast<size_t>(E), static_cast<int32_t>(rows));
  if (rows >= 0) return n;
  std::mt19937 rng(2026);
  std::normal_distribution<double> z(0.0, 0.7);
  std::vector<double> w(static_cast<size_t>(E));
  double sum = 0.0;
  for (double& v : w) sum += v = std::exp(z(rng));
  const int64_t total = 512 * E;
  int64_t given = 0;
  for (int64_t e = 0; e < E; ++e) {
    n[e] = static_cast<int32_t>(std::llround(w[e] / sum * static_cast<double>(total)));
    given += n[e];
  }
  n[0] += static_cast<int32_t>(total - given);  // exactly 512 E rows in all
  return n;
}

// Grouped SwiGLU over E = 64 experts with expert_rows(E, rows) rows each, D = 2048, I = 768; x
// and y bf16 with bf16_act.
void bench_swiglu(int64_t rows, const char* path, bool f32_weights = false, bool bf16_act = false) {
  const int64_t E = 64, D = 2048, I = 768;
  const std::vector<int32_t> counts = expert_rows(E, rows);
  std::vector<int32_t> off(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) off[e + 1] = off[e] + counts[e];
  const int64_t R = off[E];
  const DType wt = f32_weights ? DType::kF32 : DType::kBF16;
  const Tensor wg = random_device({E, I, D}, 0.02f, wt), wu = random_device({E, I, D}, 0.02f, wt);
  const Tensor wd = random_device({E, D, I}, 0.02f, wt);
  const DType act = bf16_act ? DType::kBF16 : DType::kF32;
  const Tensor x = random_device({R, D}, 1.0f, act);
  Tensor y = Tensor::empty({R, D}, act, Device::kCuda);
  const Tensor offd = device_i32(off, {E + 1});
  const int iters = R >= 2048 * E ? 10 : 20;
  std::string ran;
  const double ms = median_ms(
      [&](int) {
        ran = cuda::moe_grouped_swiglu_on(gpu(), path, x, offd, wg, wu, wd, y, Tensor());
      },
      iters, 2);
  const double tfs = 6.0 * R * D * double{I} / (ms * 1e9);
  const std::string shape =
      rows >= 0 ? "_rows" + std::to_string(rows)
                : "_skewed_mean512_rows" +
                      std::to_string(*std::min_element(counts.begin(), counts.end())) + "to" +
                      std::to_string(*std::max_element(counts.begin(), counts.end()));
  const std::string name = "moe_swiglu_" + ran + (f32_weights ? "_f32w" : "_bf16w") +
                           (bf16_act ? "_bf16act" : "") + "_E64_D2048_I768" + shape;
  emit_gpubench((name + "_vs_cublas").c_str(), tfs, "TFLOP/s", g_cublas_tfs, ms);
  if (ran == "simt") return;
  // The launches one by one (each reads what the previous left in the scratch, as in the op).
  const auto phase = [&](int bits) {
    return median_ms(
        [&](int) {
          cuda::moe_grouped_swiglu_on(gpu(), path, x, offd, wg, wu, wd, y, Tensor(), bits);
        },
        iters, 2);
  };
  if (!bf16_act) {  // a bf16 x has no cast
    const double conv = phase(1);
    emit_gpubench((name + "_phase_x_to_bf16").c_str(), 6.0 * R * D / (conv * 1e6), "GB/s",
                  g_copy_gbs, conv);
  }
  const double gate_up = phase(2), down = phase(4);
  emit_gpubench((name + "_phase_gate_up").c_str(), 4.0 * R * D * I / (gate_up * 1e9), "TFLOP/s",
                g_cublas_tfs, gate_up);
  emit_gpubench((name + "_phase_down").c_str(), 2.0 * R * D * I / (down * 1e9), "TFLOP/s",
                g_cublas_tfs, down);
}

// Decode: T tokens of K = 8 routed over E experts (T * 8 rows): the weights of every touched
// expert are read once; reported as weight bytes per second. `path` as moe_grouped_swiglu_on
// ("auto": the public dispatch, kGemv at these row counts outside batch-invariant mode).
void bench_swiglu_decode(int64_t T, bool bf16_act, const char* path = "auto", int64_t E = 64,
                         int64_t D = 2048, int64_t I = 768) {
  const int64_t K = 8, R = T * K;
  const Tensor wg = random_device({E, I, D}, 0.02f, DType::kBF16);
  const Tensor wu = random_device({E, I, D}, 0.02f, DType::kBF16);
  const Tensor wd = random_device({E, D, I}, 0.02f, DType::kBF16);
  const DType act = bf16_act ? DType::kBF16 : DType::kF32;
  const Tensor x = random_device({R, D}, 1.0f, act);
  Tensor y = Tensor::empty({R, D}, act, Device::kCuda);
  // Rows spread evenly: expert e gets rows for e < R (R <= E) or R / E each.
  std::vector<int32_t> off(E + 1);
  int64_t touched = 0;
  for (int64_t e = 0; e <= E; ++e) off[e] = static_cast<int32_t>(e * R / E);
  for (int64_t e = 0; e < E; ++e) touched += off[e + 1] > off[e];
  const Tensor offd = device_i32(off, {E + 1});
  std::string ran = path;
  const double ms = median_ms(
      [&](int) {
        if (std::string(path) == "auto") {
          moe_grouped_swiglu(gpu(), x, offd, wg, wu, wd, y);
        } else {
          ran = cuda::moe_grouped_swiglu_on(gpu(), path, x, offd, wg, wu, wd, y, Tensor());
        }
      },
      50, 3);
  const double bytes = 3.0 * touched * I * D * 2;
  const std::string shape = E == 64 && D == 2048 && I == 768
                                ? "_E64"
                                : "_E" + std::to_string(E) + "_D" + std::to_string(D) + "_I" +
                                      std::to_string(I) + "_" + ran;
  emit_gpubench(("moe_swiglu_decode" + std::string(bf16_act ? "_bf16act" : "") + "_T" +
                 std::to_string(T) + "_K8" + shape + "_weight_bytes")
                    .c_str(),
                bytes / (ms * 1e6), "GB/s", g_copy_gbs, ms);
}

std::vector<int32_t> random_ids(int64_t T, int64_t K, int64_t E) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(E - 1));
  std::vector<int32_t> ids(static_cast<size_t>(T * K));
  for (int64_t t = 0; t < T; ++t) {  // K distinct experts per token
    for (int64_t i = 0; i < K; ++i) {
      int32_t e;
      bool dup;
      do {
        e = pick(rng);
        dup = std::find(ids.begin() + t * K, ids.begin() + t * K + i, e) != ids.begin() + t * K + i;
      } while (dup);
      ids[static_cast<size_t>(t * K + i)] = e;
    }
  }
  return ids;
}

void bench_route(int64_t T, int E, int K, int ng, int kg) {
  const Tensor logits = random_device({T, E}, 2.0f), bias = random_device({E}, 0.1f);
  Tensor ids = Tensor::empty({T, K}, DType::kI32, Device::kCuda);
  Tensor w = Tensor::empty({T, K}, DType::kF32, Device::kCuda);
  RouterParams p;
  p.top_k = K;
  p.n_group = ng;
  p.topk_group = kg;
  p.routed_scaling = 2.5f;
  const double ms = median_ms([&](int) { moe_route(gpu(), logits, bias, p, ids, w); }, 50);
  const double bytes = 4.0 * T * E + 8.0 * T * K;
  emit_gpubench(("moe_route_T" + std::to_string(T) + "_E" + std::to_string(E) + "_K" +
                 std::to_string(K) + "_ng" + std::to_string(ng))
                    .c_str(),
                bytes / (ms * 1e6), "GB/s", g_copy_gbs, ms);
}

// Activations (x, x_sorted, y, out) f32, or bf16 with bf16_act.
void bench_permute_combine(int64_t T, int64_t K, int64_t E, int64_t D, bool bf16_act) {
  const DType act = bf16_act ? DType::kBF16 : DType::kF32;
  const double es = bf16_act ? 2.0 : 4.0;  // bytes per activation
  const Tensor x = random_device({T, D}, 1.0f, act);
  const Tensor ids = device_i32(random_ids(T, K, E), {T, K});
  Tensor off = Tensor::empty({E + 1}, DType::kI32, Device::kCuda);
  Tensor rows = Tensor::empty({T, K}, DType::kI32, Device::kCuda);
  Tensor xs = Tensor::empty({T * K, D}, act, Device::kCuda);
  const std::string shape = std::string(bf16_act ? "_bf16act" : "") + "_T" + std::to_string(T) +
                            "_K" + std::to_string(K) + "_E" + std::to_string(E) + "_D" +
                            std::to_string(D);
  {
    const double ms = median_ms([&](int) { moe_permute(gpu(), x, ids, 0, E, off, rows, xs); }, 30);
    const double bytes = es * T * D + es * T * K * D + 8.0 * T * K;  // x, x_sorted, ids, rows
    emit_gpubench(("moe_permute" + shape).c_str(), bytes / (ms * 1e6), "GB/s", g_copy_gbs, ms);
  }
  {
    const Tensor w = random_device({T, K}, 0.3f);
    Tensor out = Tensor::empty({T, D}, act, Device::kCuda);
    const double ms = median_ms([&](int) { moe_unpermute_combine(gpu(), xs, rows, w, out); }, 30);
    const double bytes = es * T * K * D + es * T * D + 8.0 * T * K;  // y, out, rows, weights
    emit_gpubench(("moe_combine" + shape).c_str(), bytes / (ms * 1e6), "GB/s", g_copy_gbs, ms);
  }
}

bool device_is_sm90() {
  cudaDeviceProp prop{};
  LOOM_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  return prop.major == 9 && prop.minor == 0;
}

}  // namespace
}  // namespace loom

// `moe_cuda_bench swiglu` times only the grouped SwiGLU's tensor-core paths (with the copy and
// cuBLAS rooflines), `moe_cuda_bench decode` only the decode shapes (with the copy roofline); no
// argument runs everything.
int main(int argc, char** argv) {
  using namespace loom;
  const std::string mode = argc > 1 ? argv[1] : "";
  const bool swiglu_only = mode == "swiglu";
  cuda::init();
  cudaDeviceProp prop{};
  LOOM_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (%d SMs)\n", prop.name, prop.multiProcessorCount);
  bench_copy();
  if (mode == "decode") {
    for (int64_t T : {1, 4, 8}) bench_swiglu_decode(T, true, "gemv", 256, 2304, 1024);
    bench_route(1, 256, 8, 1, 1);
    bench_route(16384, 256, 8, 1, 1);
    return 0;
  }
  bench_cublas();
  // Balanced 512 / 1024 / 2048 rows per expert, then the skewed routing (mean 512).
  for (int64_t rows : {512, 1024, 2048, -1}) {
    if (device_is_sm90()) {
      bench_swiglu(rows, "wgmma");
      bench_swiglu(rows, "wgmma", false, true);
      if (!swiglu_only) bench_swiglu(rows, "wgmma128");
    }
    if (!swiglu_only && rows != 1024) bench_swiglu(rows, "mma");
  }
  if (swiglu_only) return 0;
  bench_swiglu(512, "simt");
  bench_swiglu(512, "simt", true);
  for (int64_t T : {1, 8, 64}) {
    bench_swiglu_decode(T, false);
    bench_swiglu_decode(T, true);
  }
  // The 48B-shaped model's experts (256 of D 2304, I 1024), bf16 activations, as a decode step
  // of 1, 4 and 8 tokens routes them: the decode path against the tiled TMA kernel.
  for (int64_t T : {1, 4, 8}) {
    for (const char* path : {"gemv", "wgmma"}) bench_swiglu_decode(T, true, path, 256, 2304, 1024);
  }
  bench_route(16384, 64, 8, 1, 1);
  bench_route(16384, 256, 8, 8, 4);
  bench_route(16384, 384, 8, 1, 1);
  for (bool bf16_act : {false, true}) {
    bench_permute_combine(8192, 8, 64, 2048, bf16_act);
    bench_permute_combine(16, 8, 64, 2048, bf16_act);
  }
  return 0;
}
