// CUDA kernel benchmarks with CUDA events (median of many timed launches after warm-up), each
// next to its H200 roofline: HBM3e 4.8 TB/s (datasheet; the measured device-to-device copy is
// printed too) and plain f32 (non-tensor-core) 67 TFLOP/s (datasheet, H200.md). Inputs are random
// (never zeros) and rotated among several buffers where one set would fit in the 60 MB L2.
// Prints "GPUBENCH <name> <achieved> <unit> <roofline> <fraction> <median ms>" lines for
// tests/gpu/run.sh.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/device.h"
#include "kernels/cuda/kda_decode.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/kda.h"
#include "kernels/norm.h"
#include "tests/gpu/gpu_test_support.h"

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

double median_ms(const std::function<void(int)>& fn, int iters, int warmup = 3,
                 const std::function<void()>& pad = nullptr) {
  return median_event_ms(cuda::stream_of(gpu()), fn, iters, warmup, pad);
}

void emit(const std::string& name, double achieved, const char* unit, double roof, double ms) {
  emit_gpubench(name.c_str(), achieved, unit, roof, ms);
}

double g_copy_gbs = 0.0;  // this run's device-to-device copy: the practical bandwidth ceiling

void bench_copy() {
  const int64_t n = int64_t{1} << 28;  // 1 GiB of f32
  Tensor a = random_device({n}), b = Tensor::empty({n}, DType::kF32, Device::kCuda);
  const double ms = median_ms(
      [&](int) {
        LOOM_CUDA_CHECK(cudaMemcpyAsync(b.raw(), a.raw(), a.nbytes(), cudaMemcpyDeviceToDevice,
                                        cuda::stream_of(gpu())));
      },
      20);
  g_copy_gbs = 2.0 * a.nbytes() / (ms * 1e6);
  emit("d2d_copy_1GiB_read+write", g_copy_gbs, "GB/s", kHbmGBs, ms);
}

void bench_rmsnorm() {
  const int64_t N = 16384, D = 4096;  // 256 MiB in, 256 MiB out
  Tensor x = random_device({N, D}), w = random_device({D});
  Tensor out = Tensor::empty({N, D}, DType::kF32, Device::kCuda);
  const double ms = median_ms([&](int) { rmsnorm_forward(gpu(), x, w, 1e-6f, 0.0f, out); }, 30);
  const double bytes = 2.0 * N * D * 4 + D * 4;
  emit("rmsnorm_N16384_D4096", bytes / (ms * 1e6), "GB/s", kHbmGBs, ms);
  // The mixed-precision forward's norms: the f32 residual into a bf16 output, and bf16 to bf16
  // (q/k and KDA's o_norm), whose input is the first one's output.
  Tensor xb = Tensor::empty({N, D}, DType::kBF16, Device::kCuda);
  Tensor ob = Tensor::empty({N, D}, DType::kBF16, Device::kCuda);
  const double ms_fb = median_ms([&](int) { rmsnorm_forward(gpu(), x, w, 1e-6f, 0.0f, xb); }, 30);
  emit("rmsnorm_f32_to_bf16_N16384_D4096", (N * D * 6.0 + D * 4) / (ms_fb * 1e6), "GB/s", kHbmGBs,
       ms_fb);
  const double ms_bb = median_ms([&](int) { rmsnorm_forward(gpu(), xb, w, 1e-6f, 0.0f, ob); }, 30);
  emit("rmsnorm_bf16_N16384_D4096", (N * D * 4.0 + D * 4) / (ms_bb * 1e6), "GB/s", kHbmGBs, ms_bb);
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

// Batched KDA decode (cuda::kda_decode_batched): B sequences, one token each, Hv = Hk = 32,
// dk = dv = 128, f32 states in a slot pool. Bytes: each state read and written once,
// B * Hv * dk * dv * 4 * 2 (q, k, v, g, beta, out add < 0.4% and are left out, as the issue's
// 3.24 TB/s for flash-linear-attention counts state bytes only). The pool holds `sets` batches of
// states (>= 256 MiB in all, so L2 never holds the next call's), each call takes the next set's
// slots (shuffled). Two timings:
//  - event: CUDA events around one launch, median. A 64 MiB read-only GEMV runs before each start
//    event, so the CPU has enqueued the launch before the GPU reaches it (without it the events
//    would time the host's launch latency too) and L2 holds none of the states.
//  - graph: `n` launches (rotating sets) captured in one CUDA graph; median replay time / n. What
//    a decode step captured in a graph sees: back-to-back launches, no host in between.
// Reported against this run's device copy bandwidth (the practical ceiling, bench_copy).
struct DecodeBench {
  int64_t B, sets;
  Tensor q, k, v, g, beta, out, pool;
  std::vector<Tensor> slots;
};

DecodeBench make_decode_bench(int64_t B) {
  const int64_t H = 32, d = 128;
  const int64_t slot_bytes = H * d * d * 4;
  DecodeBench db;
  db.B = B;
  db.sets = std::max<int64_t>(3, ((int64_t{256} << 20) + B * slot_bytes - 1) / (B * slot_bytes));
  const int64_t num_slots = db.sets * B;
  db.q = random_device({B, H, d});
  db.k = random_device({B, H, d});
  l2norm_forward(gpu(), db.q, 1e-6f, 1.0f, db.q);
  l2norm_forward(gpu(), db.k, 1e-6f, 1.0f, db.k);
  db.v = random_device({B, H, d});
  // Bounded gate (lower bound -5), beta in (0, 1): realistic values, and the state stays bounded
  // over the thousands of timed steps.
  const Tensor f = random_device({B, H * d}, 2.0f), A_log = random_device({H}, 0.5f);
  db.g = Tensor::empty({B, H, d}, DType::kF32, Device::kCuda);
  kda_gate_forward(gpu(), f, A_log, Tensor(), -5.0f, db.g.reshape({B, H * d}));
  db.beta = random_device({B, H});
  sigmoid_inplace(gpu(), db.beta);
  db.out = Tensor::empty({B, H, d}, DType::kF32, Device::kCuda);
  // Random states: one random slot's worth tiled over the pool (host RNG over GiBs is slow).
  db.pool = Tensor::empty({num_slots, H, d, d}, DType::kF32, Device::kCuda);
  const Tensor one = random_device({H, d, d}, 0.1f);
  for (int64_t s = 0; s < num_slots; ++s) {
    LOOM_CUDA_CHECK(cudaMemcpyAsync(db.pool.data<float>() + s * H * d * d, one.raw(), slot_bytes,
                                    cudaMemcpyDeviceToDevice, cuda::stream_of(gpu())));
  }
  std::vector<int32_t> perm(static_cast<size_t>(num_slots));
  for (int64_t i = 0; i < num_slots; ++i) perm[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(7));
  for (int64_t s = 0; s < db.sets; ++s) {
    Tensor h = Tensor::empty({B}, DType::kI32);
    std::copy(perm.begin() + s * B, perm.begin() + (s + 1) * B, h.data<int32_t>());
    db.slots.push_back(cuda::to_device(h));
  }
  cuda::synchronize();
  return db;
}

void decode_launch(const DecodeBench& db, int set, cudaStream_t stream, int layout) {
  const int64_t H = 32, d = 128;
  cuda::launch::kda_decode_batched(
      stream, db.q.data<float>(), db.k.data<float>(), db.v.data<float>(), db.g.data<float>(),
      db.beta.data<float>(), 1.0f / std::sqrt(static_cast<float>(d)), db.pool.data<float>(),
      db.slots[static_cast<size_t>(set)].data<int32_t>(), db.out.data<float>(), db.B,
      db.sets * db.B, H, H, d, d, false, layout);
}

void emit_decode(const DecodeBench& db, const std::string& how, int layout, double ms) {
  const double bytes = 2.0 * db.B * 32 * 128 * 128 * 4;
  const double gbs = bytes / (ms * 1e6);
  const std::string name = "kda_decode_B" + std::to_string(db.B) + "_Hv32_dk128_" + how +
                           (layout == 0 ? std::string() : "_layout" + std::to_string(layout));
  emit(name + "_vs_copy", gbs, "GB/s", g_copy_gbs, ms);
  std::printf("KDADECODE %s %.3f us %.1f GB/s %.1f%% of copy %.1f%% of 4.8 TB/s\n", name.c_str(),
              ms * 1e3, gbs, 100.0 * gbs / g_copy_gbs, 100.0 * gbs / kHbmGBs);
  std::fflush(stdout);
}

void bench_kda_decode_batched(int64_t B, const std::vector<int>& layouts) {
  DecodeBench db = make_decode_bench(B);
  // The read-only pad before each timed launch (see above).
  const int64_t pad_n = 4096, pad_k = 4096;
  const Tensor pad_w = random_device({pad_n, pad_k}), pad_x = random_device({pad_k});
  Tensor pad_y = Tensor::empty({pad_n}, DType::kF32, Device::kCuda);
  const cudaStream_t s = cuda::stream_of(gpu());
  for (int layout : layouts) {
    int set = 0;
    const double ms = median_ms(
        [&](int i) {
          (void)i;
          decode_launch(db, set, s, layout);
          set = (set + 1) % static_cast<int>(db.sets);
        },
        200, 5,
        [&] {
          cuda::launch::gemv_rows(s, pad_w.data<float>(), pad_x.data<float>(), pad_y.data<float>(),
                                  pad_n, pad_k, 1.0f, 0.0f);
        });
    emit_decode(db, "event", layout, ms);
  }
  // Graph: captured on a stream of its own (the context's stream is a blocking one).
  cudaStream_t cs;
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  const int n = static_cast<int>(std::max<int64_t>(db.sets, 24));
  for (int layout : layouts) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    LOOM_CUDA_CHECK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < n; ++i) decode_launch(db, i % static_cast<int>(db.sets), cs, layout);
    LOOM_CUDA_CHECK(cudaStreamEndCapture(cs, &graph));
    LOOM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int w = 0; w < 3; ++w) LOOM_CUDA_CHECK(cudaGraphLaunch(exec, cs));
    cudaEvent_t a, b;
    LOOM_CUDA_CHECK(cudaEventCreate(&a));
    LOOM_CUDA_CHECK(cudaEventCreate(&b));
    std::vector<double> ms;
    for (int r = 0; r < 20; ++r) {
      LOOM_CUDA_CHECK(cudaEventRecord(a, cs));
      LOOM_CUDA_CHECK(cudaGraphLaunch(exec, cs));
      LOOM_CUDA_CHECK(cudaEventRecord(b, cs));
      LOOM_CUDA_CHECK(cudaEventSynchronize(b));
      float t = 0.0f;
      LOOM_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
      ms.push_back(t / n);
    }
    std::sort(ms.begin(), ms.end());
    emit_decode(db, "graph", layout, ms[ms.size() / 2]);
    LOOM_CUDA_CHECK(cudaEventDestroy(a));
    LOOM_CUDA_CHECK(cudaEventDestroy(b));
    LOOM_CUDA_CHECK(cudaGraphExecDestroy(exec));
    LOOM_CUDA_CHECK(cudaGraphDestroy(graph));
  }
  LOOM_CUDA_CHECK(cudaStreamDestroy(cs));
  // The outputs must be finite after thousands of steps (a NaN would mean a broken benchmark).
  const Tensor o = cuda::to_host(db.out);
  for (int64_t i = 0; i < o.numel(); ++i) {
    if (!std::isfinite(o.data<float>()[i])) {
      std::fprintf(stderr, "kda_decode bench: non-finite output at %lld\n",
                   static_cast<long long>(i));
      std::exit(1);
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
  loom::bench_copy();
  loom::bench_rmsnorm();
  loom::bench_gemm();
  loom::bench_kda_decode(32, 64);  // 4 MiB of state per call, 256 MiB rotated
  loom::bench_kda_decode(256, 8);  // 8 sequences' worth of heads in one launch, 256 MiB rotated
  // The shape heuristic (layout 0) and every block layout at each batch size.
  // Layout 0 (picked by shape) and each forced layout (launch.h); LOOM_KDA_DECODE_LAYOUTS="0,3"
  // sweeps a list instead.
  std::vector<int> layouts = {0, 1, 2, 3, 4, 5, 6, 7};
  if (const char* env = std::getenv("LOOM_KDA_DECODE_LAYOUTS")) {
    layouts.clear();
    for (const char* p = env; *p != '\0';) {
      char* end = nullptr;
      layouts.push_back(static_cast<int>(std::strtol(p, &end, 10)));
      p = *end == ',' ? end + 1 : end;
      if (end == p && *p != '\0') break;
    }
  }
  for (int64_t B : {1, 64, 256}) loom::bench_kda_decode_batched(B, layouts);
  return 0;
}
