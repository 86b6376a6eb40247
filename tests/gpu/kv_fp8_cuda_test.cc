// FP8 KV pages on the GPU (--kv_dtype fp8; kernels/attention.h's format: each cached vector's
// e4m3 codes and its f32 scale) against the CPU, on fresh random inputs (the seed is printed;
// LOOM_GPU_TEST_SEED replays one):
//  - the cache write: a GPU-written pool equals, byte for byte, the CPU-written one from the same
//    values (f32 and bf16 rows; vectors of 512, 64, 37, 13 values, word and byte paths; vectors
//    of every magnitude, an all-zero one, subnormal quotients, a non-finite one);
//  - the attention over fp8 pages (MLA absorbed on the wgmma kernel, the mma.sync kernel and CUDA
//    cores, MLA expanded, GQA) against the CPU twin over the same pages (which dequantizes them),
//    and against the same kernels over bf16 pages of the pre-quantization values; each MLA call
//    checks which tensor-core kernel ran (mla_wgmma_fp8_calls_run: the wgmma kernel where pages
//    hold whole 64-key tiles on a compute capability 9.0 device, or where forced);
//  - the wgmma kernel over fp8 pages against itself over bf16 pages holding the dequantized
//    values (the same splits): the same bf16 tiles, so the same outputs (bound 1e-6; a layout or
//    swizzle error is of order 1);
//  - batch-invariant numerics: each sequence alone equals its rows in the batch, bit for bit.
//
// Bounds (relative L2 of the whole output; "GPUCHECK <name> <error> <bound> <PASS|FAIL>"):
//  - CUDA cores (small MLA dims, forced MLA path 1, GQA): 1e-4, as for f32 pools
//    (attention_cuda_test.cc): the kernels dequantize each value exactly as the host does
//    (f32(code) * scale), so only the summation order differs, ~1e-6;
//  - tensor cores (R = 512, dr = 64) and the expanded form: 1e-2, as for bf16 pools: q, the
//    softmax weights and the dequantized keys are rounded to bf16 for the products (relative
//    2^-9 each), ~1e-3;
//  - fp8 against bf16 pages of the same f32 values: 0.1. e4m3 keeps 3 mantissa bits: a value
//    moves by up to 2^-4 relative, ~3.6% RMS (uniform rounding error), which the attention's
//    averages over keys damp; what this bound catches is a wrong scale or layout (errors of
//    order 1), not the quantization.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/workspace.h"
#include "kernels/attention.h"
#include "kernels/cpu/kv_fp8.h"
#include "kernels/cuda/attention.h"
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

const Exec& gpu() {
  static const Exec ex = cuda::device_exec(0);
  return ex;
}
Exec gpu_invariant() {
  Exec ex = gpu();
  ex.batch_invariant = true;
  return ex;
}

Tensor to_bf16(const Tensor& f) {
  Tensor b = Tensor::empty(f.shape(), DType::kBF16);
  for (int64_t i = 0; i < f.numel(); ++i) b.data<uint16_t>()[i] = f32_to_bf16(f.data<float>()[i]);
  return b;
}
Tensor poisoned(Shape shape, DType dtype = DType::kF32) {
  const Tensor f = Tensor::full(shape, std::nanf(""));
  return dev(dtype == DType::kBF16 ? to_bf16(f) : f);
}
Tensor i64_tensor(const std::vector<int64_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI64);
  std::copy(v.begin(), v.end(), t.data<int64_t>());
  return t;
}

double rel_l2(const Tensor& got, const Tensor& ref) {
  Tensor g = got.device().is_cuda() ? host(got) : got;
  if (g.dtype() != DType::kF32) g = g.to_f32();
  if (g.shape() != ref.shape()) return INFINITY;
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double a = g.data<float>()[i], b = ref.data<float>()[i];
    if (!std::isfinite(a) || !std::isfinite(b)) return INFINITY;
    num += (a - b) * (a - b);
    den += b * b;
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

void report(const std::string& name, double err, double tol) {
  const bool pass = err <= tol;
  std::printf("GPUCHECK %s %.3e %.3e %s\n", name.c_str(), err, tol, pass ? "PASS" : "FAIL");
  std::fflush(stdout);
  EXPECT_LE(err, tol) << name;
}

// A varlen step (as in attention_cuda_test.cc): sequence b adds lens[b] rows after past[b]
// cached positions in shuffled pages; page-table padding names page 0.
struct Step {
  std::vector<int64_t> lens, past, cu;
  int64_t B = 0, N = 0, page_size = 0, max_pages = 0, num_pages = 0;
  Tensor table, cu_h, past_h;
  Tensor table_d, cu_d, past_d;

  Step alone(int64_t b) const {
    Step s = *this;
    s.lens = {lens[b]};
    s.past = {past[b]};
    s.cu = {0, lens[b]};
    s.B = 1;
    s.N = lens[b];
    s.table = table.slice(0, b, b + 1).clone();
    s.finish();
    return s;
  }
  void finish() {
    cu_h = i64_tensor(cu);
    past_h = i64_tensor(past);
    table_d = dev(table);
    cu_d = dev(cu_h);
    past_d = dev(past_h);
  }
};

Step make_step(const std::vector<int64_t>& lens, const std::vector<int64_t>& past,
               int64_t page_size) {
  Step s;
  s.lens = lens;
  s.past = past;
  s.B = static_cast<int64_t>(lens.size());
  s.page_size = page_size;
  s.cu = {0};
  std::vector<int64_t> need(static_cast<size_t>(s.B));
  int64_t used = 0;
  for (int64_t b = 0; b < s.B; ++b) {
    s.cu.push_back(s.cu.back() + lens[b]);
    need[b] = (past[b] + lens[b] + page_size - 1) / page_size;
    s.max_pages = std::max(s.max_pages, need[b]);
    used += need[b];
  }
  s.N = s.cu.back();
  s.max_pages += 1;
  s.num_pages = used + 3;
  std::vector<int32_t> ids(static_cast<size_t>(s.num_pages));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng());
  s.table = Tensor::zeros({s.B, s.max_pages}, DType::kI32);
  for (int64_t b = 0, next = 0; b < s.B; ++b)
    for (int64_t p = 0; p < need[b]; ++p)
      s.table.data<int32_t>()[b * s.max_pages + p] = ids[next++];
  s.finish();
  return s;
}

// Decode rows over long and short contexts (split), multi-row chunks over history, prefill
// chunks with and without history, an empty sequence; shuffled.
Step mixed_step(int64_t page_size) {
  std::vector<int64_t> lens = {1, 7, 64, 65, 130, 1, 3, 0, 1, 5};
  std::vector<int64_t> past = {0, 40, 3, 100, 0, 3000, 700, 20, 1201, 2500};
  std::vector<size_t> order(lens.size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng());
  std::vector<int64_t> l2, p2;
  for (size_t i : order) {
    l2.push_back(lens[i]);
    p2.push_back(past[i]);
  }
  return make_step(l2, p2, page_size);
}

// A host pool [P, ps, vectors * n] f32 quantized per vector into [P, ps, (vectors,) n + 4] fp8
// bytes with the CPU's encoder (shape: the f32 pool's with the last dim n + 4).
Tensor quantize_pool(const Tensor& f32, int64_t n) {
  Shape s = f32.shape();
  s[s.ndim() - 1] = n + kKvFp8ScaleBytes;
  Tensor q = Tensor::empty(s, DType::kF8E4M3);
  const int64_t vecs = f32.numel() / n;
  for (int64_t v = 0; v < vecs; ++v)
    cpu::kv_fp8_quantize(f32.data<float>() + v * n, n, q.data<uint8_t>() + v * (n + 4));
  return q;
}

// Random values with a random magnitude per vector of n (2^-12 .. 2^12), so that the per-vector
// scales span a wide range, as the cache's rows do across layers and tokens.
Tensor varied(Shape shape, int64_t n) {
  Tensor t = randn(shape);
  std::uniform_real_distribution<float> e(-12.0f, 12.0f);
  for (int64_t v = 0; v < t.numel() / n; ++v) {
    const float m = std::exp2(e(rng()));
    for (int64_t i = 0; i < n; ++i) t.data<float>()[v * n + i] *= m;
  }
  return t;
}

// ---------------------------------------------------------------------------------------------
// The cache write.

struct WriteCase {
  std::string name;
  int64_t vectors, n, page_size;
  DType rows;
};

void run_write(const WriteCase& c) {
  const Step s = mixed_step(c.page_size);
  const int64_t row = c.vectors * c.n;
  Tensor rows = varied({s.N, row}, c.n);
  // Special vectors: all zero, one 2^-140 (the quotient's codes subnormal or zero), one holding
  // infinity, one NaN, one of huge values (2^120), one of equal values.
  auto vec = [&](int64_t k) {
    return rows.data<float>() + (k % s.N) * row + (k % c.vectors) * c.n;
  };
  std::fill_n(vec(0), c.n, 0.0f);
  for (int64_t i = 0; i < c.n; ++i) vec(1)[i] *= std::ldexp(1.0f, -140) / std::fabs(vec(1)[0]);
  vec(2)[c.n / 2] = std::numeric_limits<float>::infinity();
  vec(3)[c.n - 1] = std::nanf("");
  for (int64_t i = 0; i < c.n; ++i) vec(4)[i] = std::ldexp(vec(4)[i] / std::fabs(vec(4)[0]), 120);
  std::fill_n(vec(5), c.n, -3.25f);
  Tensor rows_d;
  if (c.rows == DType::kBF16) {
    const Tensor rb = to_bf16(rows);
    rows = rb.to_f32();  // the values the GPU reads
    rows_d = dev(rb);
  } else {
    rows_d = dev(rows);
  }
  Shape ps = {s.num_pages, s.page_size};
  if (c.vectors > 1) ps.push_back(c.vectors);
  ps.push_back(c.n + kKvFp8ScaleBytes);
  // Both pools start from the same random bytes: positions nobody writes must stay as they are.
  Tensor cpu_pool = Tensor::empty(ps, DType::kF8E4M3);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int64_t i = 0; i < cpu_pool.numel(); ++i)
    cpu_pool.data<uint8_t>()[i] = static_cast<uint8_t>(byte(rng()));
  const Tensor gpu_pool = dev(cpu_pool);
  Shape rs = {s.N};
  if (c.vectors > 1) rs.push_back(c.vectors);
  rs.push_back(c.n);
  cache_write_varlen(host_exec(), cpu_pool, s.table, s.cu_h, s.past_h, rows.reshape(rs));
  cache_write_varlen(gpu(), gpu_pool, s.table_d, s.cu_d, s.past_d, rows_d.reshape(rs));
  const Tensor got = host(gpu_pool);
  int64_t diff = 0;
  for (int64_t i = 0; i < got.numel(); ++i)
    diff += got.data<uint8_t>()[i] != cpu_pool.data<uint8_t>()[i];
  report("kvfp8_write_" + c.name + "_bytes_differing", static_cast<double>(diff), 0.0);
}

TEST(KvFp8Cuda, CacheWriteBitIdenticalToCpu) {
  cuda::init();
  const std::vector<WriteCase> cases = {
      {"latent512_ps64_f32", 1, 512, 64, DType::kF32},
      {"latent512_ps16_bf16rows", 1, 512, 16, DType::kBF16},
      {"rope64_ps64_bf16rows", 1, 64, 64, DType::kBF16},
      {"gqa3x37_ps16_f32", 3, 37, 16, DType::kF32},
      {"gqa2x128_ps64_bf16rows", 2, 128, 64, DType::kBF16},
      {"n13_ps16_f32", 1, 13, 16, DType::kF32},
  };
  for (const WriteCase& c : cases) run_write(c);
}

// ---------------------------------------------------------------------------------------------
// MLA.

struct MlaCase {
  std::string name;
  MlaDims dims;
  int64_t page_size;
  DType act = DType::kF32;
  cuda::AttentionTuning tuning;
  double tol = 1e-4;
};

struct MlaInputs {
  Tensor q, kv_b;         // host f32
  Tensor latent, rope;    // host f32 values before quantization
  Tensor latent8, rope8;  // host fp8 pools (what both sides read)
  Tensor qd, kv_b_d, latent8_d, rope8_d, latent16_d, rope16_d;
  float scale;
};

MlaInputs mla_inputs(const MlaCase& c, const Step& s) {
  const MlaDims& m = c.dims;
  MlaInputs in;
  in.q = randn({s.N, m.heads, m.nope_dim + m.rope_dim});
  in.latent = randn({s.num_pages, s.page_size, m.latent_dim});
  in.rope = randn({s.num_pages, s.page_size, std::max<int64_t>(m.rope_dim, 1)});
  in.kv_b = randn({m.heads * (m.nope_dim + m.v_dim), m.latent_dim},
                  1.0f / std::sqrt(static_cast<float>(m.latent_dim)));
  in.latent8 = quantize_pool(in.latent, m.latent_dim);
  in.rope8 = quantize_pool(in.rope, std::max<int64_t>(m.rope_dim, 1));
  in.latent8_d = dev(in.latent8);
  in.rope8_d = dev(in.rope8);
  in.latent16_d = dev(to_bf16(in.latent));
  in.rope16_d = dev(to_bf16(in.rope));
  if (c.act == DType::kBF16) {
    const Tensor qb = to_bf16(in.q);
    in.q = qb.to_f32();
    in.qd = dev(qb);
  } else {
    in.qd = dev(in.q);
  }
  in.kv_b_d = dev(in.kv_b);
  in.scale = 1.0f / std::sqrt(static_cast<float>(m.nope_dim + m.rope_dim));
  return in;
}

Tensor mla_gpu(const Exec& ex, const MlaCase& c, const MlaInputs& in, const Step& s,
               const Tensor& latent, const Tensor& rope, const VarlenHostLens& lens = {}) {
  const Tensor out = poisoned({s.N, c.dims.heads, c.dims.v_dim}, c.act);
  cuda::mla_attention_varlen_tuned(ex, in.qd, latent, rope, s.table_d, s.cu_d, s.past_d, in.kv_b_d,
                                   c.dims, in.scale, out, c.tuning, lens);
  return out;
}

Tensor mla_cpu(const MlaCase& c, const MlaInputs& in, const Step& s) {
  Tensor ref = Tensor::empty({s.N, c.dims.heads, c.dims.v_dim});
  mla_attention_varlen(host_exec(), in.q, in.latent8, in.rope8, s.table, s.cu_h, s.past_h, in.kv_b,
                       c.dims, in.scale, ref);
  return ref;
}

bool device_sm90() {
  cudaDeviceProp p{};
  return cudaGetDeviceProperties(&p, 0) == cudaSuccess && p.major == 9 && p.minor == 0;
}

// Whether an MLA call over fp8 pages runs on the wgmma kernel (attention.cc's plan_latent): forced,
// or by shape where the tensor-core kernels take the dims and pages hold whole 64-key tiles.
bool wants_wgmma(const MlaCase& c) {
  if (c.tuning.mla_path == 3) return true;
  return c.tuning.mla_path == 0 && c.dims.latent_dim == 512 && c.dims.rope_dim == 64 &&
         c.page_size % 64 == 0 && device_sm90();
}

void run_mla(const MlaCase& c, const Step& s, const std::string& tag = "") {
  const MlaInputs in = mla_inputs(c, s);
  const Tensor ref = mla_cpu(c, in, s);
  const std::string name = "kvfp8_mla_" + c.name + tag;
  const uint64_t before = cuda::mla_wgmma_fp8_calls_run();
  const Tensor o = mla_gpu(gpu(), c, in, s, in.latent8_d, in.rope8_d);
  report(name, rel_l2(o, ref), c.tol);
  report(name + "_invariant_mode",
         rel_l2(mla_gpu(gpu_invariant(), c, in, s, in.latent8_d, in.rope8_d), ref), c.tol);
  const uint64_t wgmma_calls = cuda::mla_wgmma_fp8_calls_run() - before;
  std::printf("GPUINFO %s wgmma_fp8_calls %llu\n", name.c_str(),
              static_cast<unsigned long long>(wgmma_calls));
  EXPECT_EQ(wgmma_calls, wants_wgmma(c) ? 2u : 0u) << name;
  // The same kernels over bf16 pages of the values before quantization.
  const Tensor o16 = host(mla_gpu(gpu(), c, in, s, in.latent16_d, in.rope16_d)).to_f32();
  report(name + "_vs_bf16_pages", rel_l2(o, o16), 0.1);
}

const MlaDims kDeepSeek{32, 128, 64, 128, 512};

TEST(KvFp8Cuda, MlaAbsorbed) {
  cuda::init();
  const cuda::AttentionTuning simt{.mla_path = 1}, mma{.mla_path = 2};
  const std::vector<MlaCase> cases = {
      {"h3_dn12_dr6_dv10_r20_ps16_bytes", {3, 12, 6, 10, 20}, 16},
      {"h5_dn16_dr8_dv12_r36_ps64_words", {5, 16, 8, 12, 36}, 64},
      {"h3_dn12_dr0_dv10_r20_ps16", {3, 12, 0, 10, 20}, 16},
      {"deepseek_ps64_tc", kDeepSeek, 64, DType::kF32, {}, 1e-2},
      {"deepseek_ps16_tc", kDeepSeek, 16, DType::kF32, {}, 1e-2},
      {"deepseek_ps64_mma_forced", kDeepSeek, 64, DType::kF32, mma, 1e-2},
      {"deepseek_ps64_simt", kDeepSeek, 64, DType::kF32, simt},
      {"deepseek_ps64_tc_bf16act", kDeepSeek, 64, DType::kBF16, {}, 1e-2},
      {"h20_ps16_tc", {20, 64, 64, 48, 512}, 16, DType::kF32, {}, 1e-2},
      {"h40_ps64_tc_headtiles", {40, 32, 64, 32, 512}, 64, DType::kF32, {}, 1e-2},
      {"deepseek_ps64_tc_perlen", kDeepSeek, 64, DType::kF32, {.split = 1}, 1e-2},
      {"deepseek_ps64_tc_nosplit", kDeepSeek, 64, DType::kF32, {.max_splits = 1}, 1e-2},
      // The wgmma kernel forced: pages of 16 keys (every tile copied row by row), 128 and 64.
      {"deepseek_ps16_wgmma_forced", kDeepSeek, 16, DType::kF32, {.mla_path = 3}, 1e-2},
      {"deepseek_ps128_wgmma_forced", kDeepSeek, 128, DType::kF32, {.mla_path = 3}, 1e-2},
      {"h40_ps64_wgmma_forced_headtiles",
       {40, 32, 64, 32, 512},
       64,
       DType::kF32,
       {.mla_path = 3},
       1e-2},
      {"deepseek_ps64_wgmma_forced_minchunk192",
       kDeepSeek,
       64,
       DType::kF32,
       {.mla_path = 3, .min_chunk = 192},
       1e-2},
  };
  for (const MlaCase& c : cases) {
    if (c.tuning.mla_path == 3 && !device_sm90()) continue;  // the wgmma kernel needs sm_90
    run_mla(c, mixed_step(c.page_size));
  }
  // Pure decode batches over contexts that are no multiple of a tile or a page: batch 37, 8
  // (by occupancy, by length, unsplit) and 1.
  std::vector<int64_t> past(37);
  std::uniform_int_distribution<int64_t> len(0, 2600);
  for (int64_t& p : past) p = len(rng());
  run_mla(cases[3], make_step(std::vector<int64_t>(37, 1), past, 64), "_decode37");
  std::vector<int64_t> past8(8);
  std::uniform_int_distribution<int64_t> len8(1, 9000);
  for (int64_t& p : past8) p = len8(rng());
  for (const MlaCase& c : {cases[3], cases[10], cases[11]})
    run_mla(c, make_step(std::vector<int64_t>(8, 1), past8, 64), "_decode8");
  run_mla(cases[3], make_step({1}, {9001}, 64), "_decode1_9001");
  run_mla(cases[3], make_step({1}, {70001}, 64), "_decode1_70001");
  run_mla(cases[5], make_step({1}, {9001}, 64), "_decode1_9001");
  run_mla(cases[0], make_step({300}, {91}, 16), "_prefill300");
}

// The wgmma kernel over fp8 pages on small steps (bulk-copied and row-by-row tiles, splits of 64
// keys, several units a block), for compute-sanitizer's racecheck, which does not finish the
// full-size tests (run it with LOOM_MLA_SYNC_HANDOFF=1, as tests/gpu/run.sh does).
TEST(KvFp8Cuda, WgmmaRacecheckSmallSteps) {
  cuda::init();
  if (!device_sm90()) GTEST_SKIP() << "the wgmma kernel needs a compute capability 9.0 device";
  for (const int64_t ps : {64, 16}) {
    const MlaCase c{"wgmma_small_ps" + std::to_string(ps), kDeepSeek, ps, DType::kF32,
                    {.mla_path = 3, .min_chunk = 64},      1e-2};
    run_mla(c, make_step({1, 5, 17, 0, 1}, {40, 130, 0, 9, 300}, ps));
  }
}

// The wgmma kernel over fp8 pages against itself over bf16 pages that hold the dequantized values
// (bf16(f32(code) * scale), what the fp8 path widens each key to), with splits by length alone
// (so both take the same splits; by occupancy they depend on the cache bytes a key): the tiles
// the products read are the same bits.
TEST(KvFp8Cuda, WgmmaFp8EqualsWgmmaOverDequantizedPages) {
  cuda::init();
  if (!device_sm90()) GTEST_SKIP() << "the wgmma kernel needs a compute capability 9.0 device";
  for (const int64_t ps : {64, 16}) {
    const MlaCase c{"wgmma_ps" + std::to_string(ps), kDeepSeek, ps, DType::kF32,
                    {.mla_path = 3, .split = 1},     1e-2};
    const Step s = mixed_step(ps);
    const MlaInputs in = mla_inputs(c, s);
    auto dequantized = [](const Tensor& q8, int64_t n) {
      Shape sh = q8.shape();
      sh[sh.ndim() - 1] = n;
      Tensor f = Tensor::empty(sh);
      for (int64_t v = 0; v < f.numel() / n; ++v)
        cpu::kv_fp8_dequantize(q8.data<uint8_t>() + v * (n + 4), n, f.data<float>() + v * n);
      return dev(to_bf16(f));
    };
    const Tensor lat16 = dequantized(in.latent8, 512), rope16 = dequantized(in.rope8, 64);
    const uint64_t before = cuda::mla_wgmma_fp8_calls_run();
    const Tensor o8 = host(mla_gpu(gpu(), c, in, s, in.latent8_d, in.rope8_d));
    EXPECT_EQ(cuda::mla_wgmma_fp8_calls_run() - before, 1u);
    const Tensor o16 = host(mla_gpu(gpu(), c, in, s, lat16, rope16));
    report("kvfp8_mla_" + c.name + "_vs_wgmma_dequantized_bf16_pages", rel_l2(o8, o16), 1e-6);
    report("kvfp8_mla_" + c.name + "_vs_cpu", rel_l2(o8, mla_cpu(c, in, s)), c.tol);
  }
}

// MLA's expanded form over fp8 pages (the gather dequantizes into bf16 rows): chosen by cost
// with the host lens, and forced for every sequence with small key blocks.
TEST(KvFp8Cuda, MlaExpanded) {
  cuda::init();
  const std::vector<int64_t> lens = {1, 300, 7, 1000, 129, 0, 131};
  const std::vector<int64_t> past = {3000, 0, 40, 777, 5000, 9, 1};
  for (const cuda::AttentionTuning& t :
       {cuda::AttentionTuning{}, cuda::AttentionTuning{.mla_form = 2, .mla_key_block = 200}}) {
    const Step s = make_step(lens, past, 64);
    const MlaCase c{
        t.mla_form == 2 ? "forced_block200" : "by_cost", kDeepSeek, 64, DType::kBF16, t, 1e-2};
    const MlaInputs in = mla_inputs(c, s);
    const Tensor ref = mla_cpu(c, in, s);
    const VarlenHostLens lens_h{s.cu_h.data<int64_t>(), s.past_h.data<int64_t>()};
    uint64_t want = 0;
    for (int64_t b = 0; b < s.B; ++b) {
      const int64_t T = s.lens[b];
      want += T > 0 && (t.mla_form == 2 || (T >= cuda::kMlaExpandedMinRows &&
                                            mla_attention_form(T, s.past[b] + T, c.dims, false) ==
                                                MlaForm::kExpanded));
    }
    ASSERT_GT(want, 0u);
    const uint64_t before = cuda::mla_expanded_sequences_run();
    const Tensor o = mla_gpu(gpu(), c, in, s, in.latent8_d, in.rope8_d, lens_h);
    EXPECT_EQ(cuda::mla_expanded_sequences_run() - before, want) << c.name;
    report("kvfp8_mla_expanded_" + c.name, rel_l2(o, ref), c.tol);
    const Tensor o16 = host(mla_gpu(gpu(), c, in, s, in.latent16_d, in.rope16_d, lens_h)).to_f32();
    report("kvfp8_mla_expanded_" + c.name + "_vs_bf16_pages", rel_l2(o, o16), 0.1);
  }
}

// ---------------------------------------------------------------------------------------------
// GQA.

struct GqaCase {
  std::string name;
  int64_t hq, hkv, d, dv, page_size;
  DType act = DType::kF32;
  double tol = 1e-4;
};

void run_gqa(const GqaCase& c, const Step& s) {
  const Tensor q = randn({s.N, c.hq, c.d});
  const Tensor k = randn({s.num_pages, s.page_size, c.hkv, c.d});
  const Tensor v = randn({s.num_pages, s.page_size, c.hkv, c.dv});
  const Tensor k8 = quantize_pool(k, c.d), v8 = quantize_pool(v, c.dv);
  const Tensor k8d = dev(k8), v8d = dev(v8);
  Tensor qh = q, qd;
  if (c.act == DType::kBF16) {
    const Tensor qb = to_bf16(q);
    qh = qb.to_f32();
    qd = dev(qb);
  } else {
    qd = dev(q);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  Tensor ref = Tensor::empty({s.N, c.hq, c.dv});
  gqa_attention_varlen(host_exec(), qh, k8, v8, s.table, s.cu_h, s.past_h, scale, ref);
  auto run = [&](const Exec& ex, const Step& st, const Tensor& kp, const Tensor& vp) {
    const Tensor o = poisoned({st.N, c.hq, c.dv}, c.act);
    gqa_attention_varlen(ex, qd.slice(0, 0, st.N), kp, vp, st.table_d, st.cu_d, st.past_d, scale,
                         o);
    return o;
  };
  const std::string name = "kvfp8_gqa_" + c.name;
  const Tensor o = run(gpu(), s, k8d, v8d);
  report(name, rel_l2(o, ref), c.tol);
  report(name + "_invariant_mode", rel_l2(run(gpu_invariant(), s, k8d, v8d), ref), c.tol);
  const Tensor o16 = host(run(gpu(), s, dev(to_bf16(k)), dev(to_bf16(v)))).to_f32();
  report(name + "_vs_bf16_pages", rel_l2(o, o16), 0.1);
}

TEST(KvFp8Cuda, Gqa) {
  cuda::init();
  const std::vector<GqaCase> cases = {
      {"h6x2_d40_dv36_ps16_words", 6, 2, 40, 36, 16},
      {"h6x2_d43_dv29_ps64_bytes", 6, 2, 43, 29, 64},
      {"h32x8_d128_ps64", 32, 8, 128, 128, 64},
      {"h12x4_d64_ps16_bf16act", 12, 4, 64, 64, 16, DType::kBF16, 1e-2},
      {"h16x2_d256_ps64_qwen3next", 16, 2, 256, 256, 64},
  };
  for (const GqaCase& c : cases) run_gqa(c, mixed_step(c.page_size));
  run_gqa(cases[2],
          make_step(std::vector<int64_t>(9, 1), {5000, 1, 31, 64, 4097, 700, 2, 129, 1500}, 64));
}

// ---------------------------------------------------------------------------------------------
// Batch invariance over fp8 pages: in batch-invariant mode, each sequence's rows alone equal its
// rows in the batch bit for bit (tensor-core MLA, CUDA-core MLA, GQA).

TEST(KvFp8Cuda, BatchInvariantAloneEqualsBatched) {
  cuda::init();
  const Step s = mixed_step(64);
  for (const MlaCase& c :
       {MlaCase{"deepseek_tc", kDeepSeek, 64, DType::kF32, {}, 1e-2},
        MlaCase{"deepseek_wgmma", kDeepSeek, 64, DType::kF32, {.mla_path = 3}, 1e-2},
        MlaCase{"deepseek_mma", kDeepSeek, 64, DType::kF32, {.mla_path = 2}, 1e-2},
        MlaCase{"small_simt", {3, 12, 6, 10, 20}, 64}}) {
    const MlaInputs in = mla_inputs(c, s);
    if (c.tuning.mla_path == 3 && !device_sm90()) continue;
    const Tensor all = host(mla_gpu(gpu_invariant(), c, in, s, in.latent8_d, in.rope8_d));
    bool same = true;
    for (int64_t b = 0; b < s.B; ++b) {
      if (s.lens[b] == 0) continue;
      const Step one = s.alone(b);
      MlaInputs sub = in;
      sub.qd = in.qd.slice(0, s.cu[b], s.cu[b + 1]);
      const Tensor o = host(mla_gpu(gpu_invariant(), c, sub, one, in.latent8_d, in.rope8_d));
      same = same && bit_equal(o, all.slice(0, s.cu[b], s.cu[b + 1]).clone());
    }
    report("kvfp8_mla_" + c.name + "_alone_vs_batched_invariant", same ? 0.0 : 1.0, 0.0);
  }
  {
    const int64_t hq = 6, hkv = 2, d = 40, dv = 36;
    const Tensor qd = dev(randn({s.N, hq, d}));
    const Tensor k8d = dev(quantize_pool(randn({s.num_pages, s.page_size, hkv, d}), d));
    const Tensor v8d = dev(quantize_pool(randn({s.num_pages, s.page_size, hkv, dv}), dv));
    auto run = [&](const Step& st, const Tensor& q) {
      const Tensor o = poisoned({st.N, hq, dv});
      gqa_attention_varlen(gpu_invariant(), q, k8d, v8d, st.table_d, st.cu_d, st.past_d, 0.15f, o);
      return host(o);
    };
    const Tensor all = run(s, qd);
    bool same = true;
    for (int64_t b = 0; b < s.B; ++b) {
      if (s.lens[b] == 0) continue;
      same = same && bit_equal(run(s.alone(b), qd.slice(0, s.cu[b], s.cu[b + 1])),
                               all.slice(0, s.cu[b], s.cu[b + 1]).clone());
    }
    report("kvfp8_gqa_alone_vs_batched_invariant", same ? 0.0 : 1.0, 0.0);
  }
}

// The wgmma kernel takes fp8 pages in 64-key tiles only: forcing 32-key tiles stops with a
// message instead of running another shape.
TEST(KvFp8CudaDeathTest, WgmmaRefusesFp8With32KeyTiles) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  cuda::init();
  if (!device_sm90()) GTEST_SKIP() << "the wgmma kernel needs a compute capability 9.0 device";
  const Step s = make_step({2}, {70}, 64);
  const MlaCase c{"wgmma", kDeepSeek, 64, DType::kF32, {.mla_path = 3, .tc_keys = 32}, 1e-2};
  const MlaInputs in = mla_inputs(c, s);
  EXPECT_DEATH(mla_gpu(gpu(), c, in, s, in.latent8_d, in.rope8_d), "64-key tiles only");
}

}  // namespace
}  // namespace loom
