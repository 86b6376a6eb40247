// Chunked KDA prefill on the GPU (kda_varlen_forward over a varlen batch, state pool by slot):
// CUDA events around each call, median of many, next to the ceilings measured in the same run
// (a 1 GiB device-to-device copy; a bf16 cuBLAS GEMM 8192^3) and the targets.
//
// Shapes: the (B = 1, H = 32, dk = dv = 128, bf16 q/k/v/beta/out, f32 gates from the
// bounded gate -5 sigmoid(.), l2-normalised q and k, f32 states, final state written) at
// T = 8192 and 32768, a varlen mix of 10 sequences, f32 at T = 8192, and the state pass with 64
// instead of 32 value columns per block. bench/peers/fla_chunk_kda.py times flash-linear-
// attention's chunk_kda on the same shapes.
//
// Inputs: random host tiles of 1024 tokens (q, k normalised, gates through kda_gate_forward)
// repeated over T on the device (host RNG over GiBs is slow; the values are realistic, never
// zeros). Every call reads 0.4 GB or more, well past the 60 MB L2.
//
// Counts. FLOPs: the tensor-core work as executed per 64-token chunk and value head: the 10
// lower 16x16 blocks of A and P (2 * 10 * 2 * 16 * 16 * dk), W = TB X (2 * 64 * 64 * dk), and in
// the state pass TB V, P v_new (2 * 2 * 64 * 64 * dv) and W S, QG S, KG^T v_new (3 * 2 * 64 * dk
// * dv): 10.75 MFLOP at dk = dv = 128. Bytes: the fewest the op must move (q, k, v, out, beta
// once in bf16, g once in f32, each state read and written once in f32).
// Prints "KDACHUNK <name> <median ms> <TFLOP/s> <GB/s> <prep ms> <state ms>" lines and GPUBENCH
// lines for the table of tests/gpu/run.sh.
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/workspace.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/kda_chunked.h"
#include "kernels/cuda/kda_chunked_launch.h"
#include "kernels/elementwise.h"
#include "kernels/kda.h"
#include "kernels/norm.h"
#include "tests/gpu/gpu_test_support.h"

namespace loom {
namespace {

const Exec& gpu() {
  static const Exec ex = cuda::device_exec(0);
  return ex;
}
cudaStream_t stream() { return cuda::stream_of(gpu()); }

double median_ms(const std::function<void()>& fn, int iters, int warmup = 2) {
  return median_event_ms(
      stream(), [&](int) { fn(); }, iters, warmup);
}

void emit(const std::string& name, double achieved, const char* unit, double roof, double ms) {
  emit_gpubench(name.c_str(), achieved, unit, roof, ms);
}

double g_copy_gbs = 0.0, g_gemm_tflops = 0.0;

void bench_ceilings() {
  {
    const int64_t n = int64_t{1} << 28;
    Tensor a = Tensor::empty({n}, DType::kF32, Device::kCuda);
    Tensor b = Tensor::empty({n}, DType::kF32, Device::kCuda);
    LOOM_CUDA_CHECK(cudaMemsetAsync(a.raw(), 0x3f, a.nbytes(), stream()));
    const double ms = median_ms(
        [&] {
          LOOM_CUDA_CHECK(
              cudaMemcpyAsync(b.raw(), a.raw(), a.nbytes(), cudaMemcpyDeviceToDevice, stream()));
        },
        20);
    g_copy_gbs = 2.0 * a.nbytes() / (ms * 1e6);
    emit("ceiling_d2d_copy_1GiB", g_copy_gbs, "GB/s", 4800.0, ms);
  }
  {
    const int n = 8192;
    // Random bf16 operands (a 1M-element host tile repeated): zeros would run faster.
    Tensor tile = Tensor::empty({int64_t{1} << 20}, DType::kBF16);
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int64_t i = 0; i < tile.numel(); ++i) tile.data<uint16_t>()[i] = f32_to_bf16(nd(rng));
    const Tensor td = cuda::to_device(tile);
    std::vector<Tensor> m;
    for (int i = 0; i < 3; ++i) {
      m.push_back(Tensor::empty({int64_t{n} * n}, DType::kBF16, Device::kCuda));
      for (int64_t o = 0; o < int64_t{n} * n; o += tile.numel())
        LOOM_CUDA_CHECK(cudaMemcpyAsync(static_cast<uint16_t*>(m.back().raw()) + o, td.raw(),
                                        td.nbytes(), cudaMemcpyDeviceToDevice, stream()));
    }
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) std::abort();
    cublasSetStream(h, stream());
    const float one = 1.0f, zero = 0.0f;
    const double ms = median_ms(
        [&] {
          if (cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, m[0].raw(), CUDA_R_16BF, n,
                           m[1].raw(), CUDA_R_16BF, n, &zero, m[2].raw(), CUDA_R_16BF, n,
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
            std::abort();
        },
        20);
    cublasDestroy(h);
    g_gemm_tflops = 2.0 * n * double{n} * n / (ms * 1e9);
    emit("ceiling_bf16_gemm_8192", g_gemm_tflops, "TFLOP/s", 989.0, ms);
  }
}

// Repeats a host tile over a device tensor of the same dtype.
Tensor tiled(const Tensor& tile, Shape shape) {
  Tensor d = Tensor::empty(shape, tile.dtype(), Device::kCuda);
  const Tensor td = cuda::to_device(tile);
  const size_t total = d.nbytes(), piece = td.nbytes();
  for (size_t o = 0; o < total; o += piece)
    LOOM_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(d.raw()) + o, td.raw(),
                                    std::min(piece, total - o), cudaMemcpyDeviceToDevice,
                                    stream()));
  return d;
}

Tensor to_dtype(const Tensor& f, DType dt) {
  if (dt == DType::kF32) return f;
  Tensor b = Tensor::empty(f.shape(), DType::kBF16);
  for (int64_t i = 0; i < f.numel(); ++i) b.data<uint16_t>()[i] = f32_to_bf16(f.data<float>()[i]);
  return b;
}

struct Problem {
  std::string name;
  std::vector<int64_t> lens;
  bool bf16 = true;
  int bv = 0;
  int iters = 20;
};

void bench(const Problem& p) {
  const int64_t H = 32, d = 128, tileT = 1024;
  const int64_t B = static_cast<int64_t>(p.lens.size());
  const int64_t N = std::accumulate(p.lens.begin(), p.lens.end(), int64_t{0});
  const DType act = p.bf16 ? DType::kBF16 : DType::kF32;
  std::mt19937 rng(1234);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto randn = [&](Shape s, float scale) {
    Tensor t = Tensor::empty(s);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = scale * nd(rng);
    return t;
  };
  Tensor qt = randn({tileT, H, d}, 1.0f), kt = randn({tileT, H, d}, 1.0f);
  l2norm_forward(host_exec(), qt, 1e-6f, 1.0f, qt);
  l2norm_forward(host_exec(), kt, 1e-6f, 1.0f, kt);
  const Tensor vt = randn({tileT, H, d}, 1.0f), ft = randn({tileT, H * d}, 2.0f);
  Tensor A_log = Tensor::empty({H});
  for (int64_t h = 0; h < H; ++h) A_log.data<float>()[h] = -2.0f + 2.5f * (h + 0.5f) / H;
  Tensor gt = Tensor::empty({tileT, H * d});
  kda_gate_forward(host_exec(), ft, A_log, Tensor(), -5.0f, gt);
  Tensor bt = randn({tileT, H}, 1.0f);
  sigmoid_inplace(host_exec(), bt);
  const Tensor q = tiled(to_dtype(qt, act), {N, H, d}), k = tiled(to_dtype(kt, act), {N, H, d});
  const Tensor v = tiled(to_dtype(vt, act), {N, H, d});
  const Tensor g = tiled(gt.reshape({tileT, H, d}), {N, H, d});
  const Tensor beta = tiled(to_dtype(bt, act), {N, H});
  Tensor out = Tensor::empty({N, H, d}, act, Device::kCuda);
  // State pool: 2B + 1 slots, sequence b in slot 2b + 1 (small random states).
  const int64_t num_slots = 2 * B + 1;
  Tensor pool = tiled(randn({H, d, d}, 0.1f), {num_slots, H, d, d});
  Tensor slots_h = Tensor::empty({B}, DType::kI32), cu_h = Tensor::empty({B + 1}, DType::kI64);
  cu_h.data<int64_t>()[0] = 0;
  for (int64_t b = 0; b < B; ++b) {
    slots_h.data<int32_t>()[b] = static_cast<int32_t>(2 * b + 1);
    cu_h.data<int64_t>()[b + 1] = cu_h.data<int64_t>()[b] + p.lens[static_cast<size_t>(b)];
  }
  const Tensor slots = cuda::to_device(slots_h), cu = cuda::to_device(cu_h);
  cuda::launch::KdaVarlenArgs a;
  a.q = q.raw();
  a.k = k.raw();
  a.v = v.raw();
  a.g = g.data<float>();
  a.beta = beta.raw();
  a.out = out.raw();
  a.pool = pool.data<float>();
  a.slots = slots.data<int32_t>();
  a.cu = cu.data<int64_t>();
  a.scale = 1.0f / std::sqrt(static_cast<float>(d));
  a.B = B;
  a.N = N;
  a.num_slots = num_slots;
  a.Hk = a.Hv = static_cast<int>(H);
  a.dk = a.dv = static_cast<int>(d);
  a.bf16 = a.beta_bf16 = p.bf16;
  Workspace ws(Device::kCuda, cuda::launch::kda_chunked_workspace_bytes(a) + (1 << 20));
  Exec ex = gpu();
  ex.workspace = &ws;
  const double ms = median_ms(
      [&] {
        cuda::kda_varlen_forward_tuned(ex, q, k, v, g, beta, a.scale, pool, slots, cu, out, 0,
                                       p.bv);
      },
      p.iters);
  // The phases alone (same workspace: the state pass re-reads what the last full call left).
  void* w =
      ws.take({static_cast<int64_t>(cuda::launch::kda_chunked_workspace_bytes(a))}, DType::kU8)
          .raw();
  const int64_t rmax = kKdaRecurrentMaxTokens;
  const double prep_ms =
      median_ms([&] { cuda::launch::kda_chunked_varlen(stream(), a, rmax, w, p.bv, 1); }, p.iters);
  const double state_ms =
      median_ms([&] { cuda::launch::kda_chunked_varlen(stream(), a, rmax, w, p.bv, 2); }, p.iters);
  ws.reset();
  // Counts (sequences of <= 8 rows run the recurrence and are counted like the others).
  double flops = 0.0;
  for (int64_t len : p.lens) {
    const double chunks = std::ceil(len / 64.0);
    flops += chunks * H *
             (2.0 * 10 * 2 * 16 * 16 * d + 2.0 * 64 * 64 * d + 2.0 * 2 * 64 * 64 * d +
              3.0 * 2 * 64 * d * d);
  }
  const double es = p.bf16 ? 2.0 : 4.0;
  const double bytes =
      N * H * (d * es * 4 + d * 4.0 + es) + 2.0 * B * H * d * d * 4.0;  // q k v out, g, beta
  const double tflops = flops / (ms * 1e9), gbs = bytes / (ms * 1e6);
  std::printf("KDACHUNK %s %.4f %.1f %.1f %.4f %.4f\n", p.name.c_str(), ms, tflops, gbs, prep_ms,
              state_ms);
  emit(p.name + "_tensor_flops", tflops, "TFLOP/s", g_gemm_tflops, ms);
  emit(p.name + "_min_bytes", gbs, "GB/s", g_copy_gbs, ms);
  // A finite output after the timed calls (a NaN would mean a broken benchmark).
  const Tensor o = cuda::to_host(out).to_f32();
  for (int64_t i = 0; i < o.numel(); i += 997) {
    if (!std::isfinite(o.data<float>()[i])) {
      std::fprintf(stderr, "%s: non-finite output at %lld\n", p.name.c_str(),
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
  // LOOM_KDA_BENCH_ONLY=<name>: that problem alone, 3 timed calls, no ceilings (for ncu).
  const char* only = std::getenv("LOOM_KDA_BENCH_ONLY");
  if (only == nullptr) loom::bench_ceilings();
  const std::vector<int64_t> mix = {4096, 2048, 1024, 512, 300, 65, 9, 3, 1000, 1};
  const std::vector<loom::Problem> problems = {
      {.name = "kda_chunk_B1_H32_T8192_bf16", .lens = {8192}},
      {.name = "kda_chunk_B1_H32_T8192_bf16_bv64", .lens = {8192}, .bv = 64},
      {.name = "kda_chunk_B1_H32_T32768_bf16", .lens = {32768}, .iters = 10},
      {.name = "kda_chunk_varlen10_H32_N9058_bf16", .lens = mix},
      {.name = "kda_chunk_B1_H32_T8192_f32", .lens = {8192}, .bf16 = false, .iters = 5},
  };
  for (loom::Problem p : problems) {
    if (only != nullptr && p.name != only) continue;
    if (only != nullptr) p.iters = 3;
    loom::bench(p);
  }
  return 0;
}
