// The varlen forms of the short convolution and the paged cache write on the GPU
// (causal_conv1d_varlen, kernels/conv.h; cache_write_varlen, kernels/attention.h) against their
// CPU twins, on fresh random inputs (the seed is printed; LOOM_GPU_TEST_SEED replays one).
//
// Batches mix sequence lengths 0, 1, 2 (shorter than W-1 = 3, so the new state keeps old state
// rows), 3, 7, 64, 65 and 130 in shuffled order, in shuffled slots of a pool larger than the batch
// (every state non-zero) or on shuffled pages; channel counts are odd (the one-channel path) or
// multiples of 4 (the four-channel path). Outputs are NaN before the call; the whole pool is
// compared after it, so named slots and untouched ones are both checked.
//
// Bounds (each check prints "GPUCHECK <name> <error> <bound> <PASS|FAIL>" for tests/gpu/run.sh):
//  - conv outputs: scaled error max |gpu - cpu| / max(1, max |cpu|) <= (W + 4) eps, the bound of
//    cuda_kernels_test.cc's CausalConv1d. Both sides sum the same W products in the same order
//    (j = 0 .. W-1), but the GPU fuses each multiply-add (one rounding where the CPU may have two,
//    depending on the host compiler's contraction), so they differ by at most ~W u sum_j |w_j x_j|
//    (~1.3 for these inputs, against max |cpu| ~ 4-5), plus a few ulp of expf inside SiLU.
//    Observed on the H200 (-march=native host build, which contracts too): 0 without SiLU,
//    at most 9.2e-8 (0.8 eps) with it;
//  - conv outputs against the GPU's own per-sequence causal_conv1d_forward: 0 (same operations,
//    the contract's "exactly what causal_conv1d_forward gives it alone");
//  - conv states and the cache pool: 0 (copies).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "kernels/conv.h"
#include "kernels/cuda/conv_varlen.h"
#include "kernels/cuda/device.h"
#include "tests/gpu/gpu_test_support.h"
#include "tests/gpu/twin_tolerances.h"

namespace loom {
namespace {

std::mt19937_64& rng() {
  static std::mt19937_64 r(gpu_test_seed());
  return r;
}

Tensor randn(Shape shape, float scale = 1.0f) { return twin::randn(rng(), shape, scale); }
Tensor dev(const Tensor& h) { return cuda::to_device(h); }
Tensor host(const Tensor& d) { return cuda::to_host(d); }
Tensor poisoned(Shape shape) { return dev(Tensor::full(shape, std::nanf(""))); }

const Exec& gpu() {
  static const Exec ex = cuda::device_exec(0);
  return ex;
}

Tensor i64_tensor(const std::vector<int64_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI64);
  std::copy(v.begin(), v.end(), t.data<int64_t>());
  return t;
}
Tensor i32_tensor(const std::vector<int32_t>& v, Shape shape) {
  Tensor t = Tensor::empty(shape, DType::kI32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

double scaled_err(const Tensor& got, const Tensor& ref) {
  return twin::scaled_err(got.device() == Device::kCuda ? host(got) : got, ref);
}

void report(const std::string& name, double err, double tol) {
  const bool pass = err <= tol;  // false for NaN
  std::printf("GPUCHECK %s %.3e %.3e %s\n", name.c_str(), err, tol, pass ? "PASS" : "FAIL");
  std::fflush(stdout);
  EXPECT_LE(err, tol) << name;
}

// The mixed lengths of every batch, shuffled.
std::vector<int64_t> mixed_lengths() {
  std::vector<int64_t> lens = {0, 1, 2, 3, 7, 64, 65, 130, 1, 2};
  std::shuffle(lens.begin(), lens.end(), rng());
  return lens;
}

std::vector<int64_t> cumulative(const std::vector<int64_t>& lens) {
  std::vector<int64_t> cu(lens.size() + 1, 0);
  for (size_t b = 0; b < lens.size(); ++b) cu[b + 1] = cu[b] + lens[b];
  return cu;
}

// B distinct slots drawn from [0, num_slots) in random order.
std::vector<int32_t> shuffled_ids(int64_t B, int64_t num_ids) {
  std::vector<int32_t> ids(static_cast<size_t>(num_ids));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng());
  ids.resize(static_cast<size_t>(B));
  return ids;
}

class VarlenOpsCuda : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cuda::init();
    (void)gpu_test_seed();
  }
};

// ---------------------------------------------------------------------------------------------
// causal_conv1d_varlen.
struct ConvCase {
  std::string name;
  int64_t C, W;
  std::vector<int64_t> lens;
  int64_t rows_per_block;  // 0: the launcher's choice (through the public dispatch)
  bool vec4 = true;        // allow the four-channel path
};

void run_conv_case(const ConvCase& k) {
  const int64_t C = k.C, W = k.W, P = W - 1, B = static_cast<int64_t>(k.lens.size());
  const std::vector<int64_t> cu = cumulative(k.lens);
  const int64_t N = cu.back(), num_slots = B + 5;
  const std::vector<int32_t> slots = shuffled_ids(B, num_slots);
  const Tensor x = randn({N, C}), w = randn({C, W}, 0.5f), pool0 = randn({num_slots, P, C});
  const Tensor cu_h = i64_tensor(cu), slots_h = i32_tensor(slots, {B});
  for (bool silu : {false, true}) {
    const std::string tag = k.name + (silu ? "_silu" : "");
    Tensor pool_ref = pool0.clone(), ref = Tensor::empty({N, C});
    causal_conv1d_varlen(host_exec(), x, w, pool_ref, slots_h, cu_h, silu, ref);

    const Tensor xd = dev(x), wd = dev(w), pool_d = dev(pool0), od = poisoned({N, C});
    const Tensor cu_d = dev(cu_h), slots_d = dev(slots_h);
    if (k.rows_per_block == 0 && k.vec4) {
      causal_conv1d_varlen(gpu(), xd, wd, pool_d, slots_d, cu_d, silu, od);
    } else {
      cuda::causal_conv1d_varlen_tuned(gpu(), xd, wd, pool_d, slots_d, cu_d, silu, od,
                                       k.rows_per_block, k.vec4);
    }
    const Tensor out = host(od), pool = host(pool_d);
    report("conv_varlen_" + tag, scaled_err(out, ref), (W + 4) * twin::kEps);

    // The named slots (new states) and the others (untouched), both exact.
    std::vector<bool> named(static_cast<size_t>(num_slots), false);
    for (int32_t s : slots) named[static_cast<size_t>(s)] = true;
    double named_err = 0.0, other_err = 0.0;
    for (int64_t s = 0; s < num_slots; ++s) {
      double& err = named[static_cast<size_t>(s)] ? named_err : other_err;
      err = std::max(err, scaled_err(pool.select(s).clone(), pool_ref.select(s).clone()));
    }
    report("conv_varlen_state_" + tag, named_err, 0.0);
    report("conv_varlen_untouched_" + tag, other_err, 0.0);

    // Each sequence alone through the GPU's causal_conv1d_forward: the same bits.
    double alone_err = 0.0;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t T = k.lens[static_cast<size_t>(b)];
      if (T == 0) continue;
      const Tensor st = dev(pool0.select(slots[static_cast<size_t>(b)])), o1 = poisoned({T, C});
      causal_conv1d_forward(gpu(), xd.slice(0, cu[b], cu[b] + T), wd, st, silu, o1);
      alone_err = std::max(alone_err, scaled_err(o1, out.slice(0, cu[b], cu[b] + T).clone()));
      alone_err =
          std::max(alone_err, scaled_err(st, pool.select(slots[static_cast<size_t>(b)]).clone()));
    }
    report("conv_varlen_vs_gpu_forward_" + tag, alone_err, 0.0);
  }
}

TEST_F(VarlenOpsCuda, CausalConv1dVarlen) {
  const std::vector<ConvCase> cases = {
      // W = 4 (the KDA / Gated DeltaNet width): odd channels, then the four-channel path, with
      // the launcher's chunking and with chunks of 1, 3 (boundaries inside the first W-1 rows of
      // sequences) and 32 rows.
      {"C129_W4", 129, 4, mixed_lengths(), 0},
      {"C129_W4_L1", 129, 4, mixed_lengths(), 1},
      {"C129_W4_L3", 129, 4, mixed_lengths(), 3},
      {"C129_W4_L32", 129, 4, mixed_lengths(), 32},
      {"C256_W4", 256, 4, mixed_lengths(), 0},
      {"C256_W4_L3", 256, 4, mixed_lengths(), 3},
      {"C256_W4_L32", 256, 4, mixed_lengths(), 32},
      {"C256_W4_scalar_L5", 256, 4, mixed_lengths(), 5, false},
      // Other compiled widths and the any-width path (W = 5, 6).
      {"C67_W2_L3", 67, 2, mixed_lengths(), 3},
      {"C67_W3", 67, 3, mixed_lengths(), 0},
      {"C67_W5_L3", 67, 5, mixed_lengths(), 3},
      {"C68_W6", 68, 6, mixed_lengths(), 0},
      {"C68_W6_L7", 68, 6, mixed_lengths(), 7},
      // A decode batch (one token each; the CPU runs its step code) and a long single prefill.
      {"decode_B37_C131_W4", 131, 4, std::vector<int64_t>(37, 1), 0},
      {"decode_B37_C132_W4_L4", 132, 4, std::vector<int64_t>(37, 1), 4},
      {"prefill_T1000_C132_W4", 132, 4, {1000}, 0},
      {"prefill_T1000_C132_W4_L32", 132, 4, {1000}, 32},
  };
  for (const ConvCase& k : cases) run_conv_case(k);
}

// ---------------------------------------------------------------------------------------------
// cache_write_varlen.
void run_cache_case(const std::string& name, Shape row_shape, int64_t page_size) {
  const std::vector<int64_t> lens = mixed_lengths();
  const int64_t B = static_cast<int64_t>(lens.size());
  const std::vector<int64_t> cu = cumulative(lens);
  const int64_t N = cu.back();
  std::vector<int64_t> past(static_cast<size_t>(B));
  std::uniform_int_distribution<int64_t> pick_past(0, 3 * page_size);
  for (auto& p : past) p = pick_past(rng());
  past[0] = 0;  // a new sequence
  std::vector<int64_t> pages_of(static_cast<size_t>(B));
  int64_t max_pages = 0, used = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = past[b] + lens[b];
    pages_of[b] = (len + page_size - 1) / page_size;
    max_pages = std::max(max_pages, pages_of[b]);
    used += pages_of[b];
  }
  max_pages += 1;                      // a column no sequence reaches: -1, never read
  const int64_t num_pages = used + 7;  // 7 pages nobody owns
  const std::vector<int32_t> perm = shuffled_ids(num_pages, num_pages);
  std::vector<int32_t> table(static_cast<size_t>(B * max_pages), -1);
  int64_t next = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t p = 0; p < pages_of[b]; ++p) table[b * max_pages + p] = perm[next++];

  int64_t row = 1;
  Shape pool_shape = {num_pages, page_size};
  Shape rows_shape = {N};
  for (int64_t d : row_shape) {
    row *= d;
    pool_shape.push_back(d);
    rows_shape.push_back(d);
  }
  Tensor pool0 = randn(pool_shape);  // cached history and unowned pages: must survive
  // The positions about to be written hold NaN: a row the kernel misses fails the comparison.
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = past[b]; j < past[b] + lens[b]; ++j) {
      float* p = pool0.data<float>() +
                 (table[b * max_pages + j / page_size] * page_size + j % page_size) * row;
      std::fill(p, p + row, std::nanf(""));
    }
  const Tensor rows = randn(rows_shape);
  const Tensor pt = i32_tensor(table, {B, max_pages}), cu_h = i64_tensor(cu),
               past_h = i64_tensor(past);
  Tensor ref = pool0.clone();
  cache_write_varlen(host_exec(), ref, pt, cu_h, past_h, rows);
  Tensor pool_d = dev(pool0);
  cache_write_varlen(gpu(), pool_d, dev(pt), dev(cu_h), dev(past_h), dev(rows));
  report("cache_write_varlen_" + name, scaled_err(pool_d, ref), 0.0);

  // A bf16 pool (a bf16 KV cache): every element must be the CPU result rounded to nearest even,
  // bit for bit, the untouched history included.
  auto to_bf16 = [](const Tensor& f) {
    Tensor b = Tensor::empty(f.shape(), DType::kBF16);
    for (int64_t i = 0; i < f.numel(); ++i) b.data<uint16_t>()[i] = f32_to_bf16(f.data<float>()[i]);
    return b;
  };
  Tensor pool_b = dev(to_bf16(pool0));
  cache_write_varlen(gpu(), pool_b, dev(pt), dev(cu_h), dev(past_h), dev(rows));
  const Tensor got = pool_b.to(Device::kCpu), want = to_bf16(ref);
  int64_t differing = 0;
  for (int64_t i = 0; i < got.numel(); ++i)
    differing += got.data<uint16_t>()[i] != want.data<uint16_t>()[i];
  report("cache_write_varlen_bf16pool_" + name, static_cast<double>(differing), 0.0);
}

TEST_F(VarlenOpsCuda, CacheWriteVarlen) {
  run_cache_case("row3x43_ps16", {3, 43}, 16);    // 129 floats: 4-byte units
  run_cache_case("row64_ps16", {64}, 16);         // 16-byte units, 16 threads a row
  run_cache_case("row8x128_ps64", {8, 128}, 64);  // GQA-like, 32 threads a row
  run_cache_case("row5_ps7", {5}, 7);             // odd page size, 8 threads a row
}

// ---------------------------------------------------------------------------------------------
// Timing (CUDA events, median of 50 after warm-up) against this run's device-to-device copy.
// Prints "VARLENBENCH <name> <us> <GB/s> <fraction of copy>".
Tensor filled_device(Shape shape) {
  Tensor h = Tensor::empty(shape);
  uint32_t s = static_cast<uint32_t>(rng()());
  float* p = h.data<float>();
  for (int64_t i = 0; i < h.numel(); ++i) {
    s = s * 1664525u + 1013904223u;
    p[i] = static_cast<float>(static_cast<int32_t>(s >> 8) - (1 << 23)) * (1.0f / (1 << 23));
  }
  return dev(h);
}

template <typename F>
double median_ms(F&& f, int reps = 50) {
  return median_event_ms(
      cuda::stream_of(gpu()), [&](int) { f(); }, reps, 3);
}

void bench_line(const std::string& name, double ms, double bytes, double copy_gbs) {
  const double gbs = bytes / (ms * 1e6);
  std::printf("VARLENBENCH %s %.2f us %.1f GB/s %.1f%% of copy\n", name.c_str(), ms * 1e3, gbs,
              copy_gbs > 0 ? 100.0 * gbs / copy_gbs : 0.0);
  std::fflush(stdout);
}

TEST_F(VarlenOpsCuda, Timing) {
  const cudaStream_t stream = cuda::stream_of(gpu());
  double copy_gbs = 0.0;
  {
    const int64_t n = int64_t{1} << 28;  // 1 GiB of f32
    const Tensor a = filled_device({n}), b = Tensor::empty({n}, DType::kF32, Device::kCuda);
    const double ms = median_ms([&] {
      LOOM_CUDA_CHECK(
          cudaMemcpyAsync(b.raw(), a.raw(), a.nbytes(), cudaMemcpyDeviceToDevice, stream));
    });
    copy_gbs = 2.0 * a.nbytes() / (ms * 1e6);
    bench_line("d2d_copy_1GiB_read+write", ms, 2.0 * a.nbytes(), copy_gbs);
  }
  // Conv: KDA's q, k, v channels at 32 heads of 128 (C = 12288), W = 4, SiLU. Bytes: x read, out
  // written, each state read and written, weights.
  const int64_t C = 3 * 32 * 128, W = 4, P = W - 1;
  const Tensor w = filled_device({C, W});
  auto bench_conv = [&](const std::string& name, const std::vector<int64_t>& lens) {
    const int64_t B = static_cast<int64_t>(lens.size());
    const std::vector<int64_t> cu = cumulative(lens);
    const int64_t N = cu.back();
    const Tensor x = filled_device({N, C}), out = Tensor::empty({N, C}, DType::kF32, Device::kCuda);
    const Tensor pool = filled_device({B + 8, P, C});
    const Tensor cu_d = dev(i64_tensor(cu)), slots_d = dev(i32_tensor(shuffled_ids(B, B + 8), {B}));
    const double ms =
        median_ms([&] { causal_conv1d_varlen(gpu(), x, w, pool, slots_d, cu_d, true, out); });
    bench_line(name, ms, 4.0 * (2.0 * N * C + 2.0 * B * P * C + C * W), copy_gbs);
  };
  for (int64_t L : {16, 32, 64, 128}) {  // chunk lengths, one sequence of 8192 rows
    const int64_t N = 8192;
    const Tensor x = filled_device({N, C}), out = Tensor::empty({N, C}, DType::kF32, Device::kCuda);
    const Tensor pool = filled_device({1, P, C});
    const Tensor cu_d = dev(i64_tensor({0, N})), slots_d = dev(i32_tensor({0}, {1}));
    const double ms = median_ms([&] {
      cuda::causal_conv1d_varlen_tuned(gpu(), x, w, pool, slots_d, cu_d, true, out, L, true);
    });
    bench_line("conv_varlen_prefill_B1x8192_L" + std::to_string(L), ms, 4.0 * 2.0 * N * C,
               copy_gbs);
  }
  bench_conv("conv_varlen_prefill_B4x2048_C12288", std::vector<int64_t>(4, 2048));
  bench_conv("conv_varlen_prefill_B1x8192_C12288", {8192});
  bench_conv("conv_varlen_decode_B256_C12288", std::vector<int64_t>(256, 1));
  bench_conv("conv_varlen_decode_B32_C12288", std::vector<int64_t>(32, 1));
  {  // Reference: causal_conv1d_step (states [B, W-1, C] in batch order: no index loads).
    const int64_t B = 256;
    const Tensor x = filled_device({B, C}), out = Tensor::empty({B, C}, DType::kF32, Device::kCuda);
    const Tensor states = filled_device({B, P, C});
    const double ms = median_ms([&] { causal_conv1d_step(gpu(), x, w, states, true, out); });
    bench_line("conv_step_B256_C12288_reference", ms, 4.0 * (2.0 * B * C + 2.0 * B * P * C + C * W),
               copy_gbs);
  }
  bench_conv("conv_varlen_mixed_B64_C12288", [] {
    std::vector<int64_t> l(64, 1);
    l[0] = 3000;
    l[1] = 130;
    l[2] = 2;
    return l;
  }());

  // Cache write: rows of 1024 floats (GQA, 8 kv heads of 128) or 512 (an MLA latent), pages of
  // 64 positions. Bytes: rows read, pool rows written.
  auto bench_cache = [&](const std::string& name, const std::vector<int64_t>& lens, int64_t row,
                         int64_t past_len) {
    const int64_t B = static_cast<int64_t>(lens.size()), ps = 64;
    const std::vector<int64_t> cu = cumulative(lens);
    const int64_t N = cu.back();
    const int64_t per = (past_len + *std::max_element(lens.begin(), lens.end()) + ps - 1) / ps;
    const int64_t num_pages = B * per;
    const std::vector<int32_t> perm = shuffled_ids(num_pages, num_pages);
    const Tensor pt = dev(i32_tensor(perm, {B, per}));
    const Tensor pool = filled_device({num_pages, ps, row}), rows = filled_device({N, row});
    const Tensor cu_d = dev(i64_tensor(cu)),
                 past_d = dev(i64_tensor(std::vector<int64_t>(static_cast<size_t>(B), past_len)));
    const double ms = median_ms([&] { cache_write_varlen(gpu(), pool, pt, cu_d, past_d, rows); });
    bench_line(name, ms, 2.0 * 4.0 * N * row, copy_gbs);
  };
  bench_cache("cache_write_prefill_B4x4096_row1024", std::vector<int64_t>(4, 4096), 1024, 0);
  bench_cache("cache_write_decode_B256_row512", std::vector<int64_t>(256, 1), 512, 1000);
  cuda::synchronize();
}

}  // namespace
}  // namespace loom
