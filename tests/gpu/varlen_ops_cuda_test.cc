// The varlen forms of the short convolution and the paged cache write on the GPU
// (causal_conv1d_varlen, kernels/conv.h; cache_write_varlen, kernels/attention.h) against their
// CPU twins, on fresh random inputs (the seed is printed; LOOM_GPU_TEST_SEED replays one); then
// the same ops and the Block-AttnRes aggregation and the KDA / Gated DeltaNet token recurrence
// with bf16 activations (see "bf16 activations" below for their bounds).
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
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "kernels/attention.h"
#include "kernels/attnres.h"
#include "kernels/conv.h"
#include "kernels/cuda/conv_varlen.h"
#include "kernels/cuda/device.h"
#include "kernels/kda.h"
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
Tensor host_f32(const Tensor& d) { return host(d).to_f32(); }

// A host f32 tensor in `dtype`: a copy, or each value rounded to nearest even bf16.
Tensor to_dtype(const Tensor& f, DType dtype) {
  if (dtype == DType::kF32) return f.clone();
  Tensor b = Tensor::empty(f.shape(), DType::kBF16);
  for (int64_t i = 0; i < f.numel(); ++i) b.data<uint16_t>()[i] = f32_to_bf16(f.data<float>()[i]);
  return b;
}
// The values of a host f32 tensor rounded to bf16, kept in f32 (what a bf16 input means exactly).
Tensor bf16_rounded(const Tensor& f) { return to_dtype(f, DType::kBF16).to_f32(); }

// A device tensor of `dtype` full of NaN.
Tensor poisoned(Shape shape, DType dtype = DType::kF32) {
  return dev(to_dtype(Tensor::full(shape, std::nanf("")), dtype));
}

const char* dtype_tag(DType dtype) { return dtype == DType::kBF16 ? "bf16" : "f32"; }

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

// ||got - ref|| / ||ref|| of two host f32 tensors of one shape (inf on NaN or a shape mismatch).
double rel_l2(const Tensor& got, const Tensor& ref) {
  if (got.shape() != ref.shape()) return INFINITY;
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double g = got.data<float>()[i], r = ref.data<float>()[i];
    if (!std::isfinite(g)) return INFINITY;
    num += (g - r) * (g - r);
    den += r * r;
  }
  return den == 0.0 ? std::sqrt(num) : std::sqrt(num / den);
}

// Elements whose bits differ between two host tensors of one dtype and shape (all of them if the
// shapes or dtypes differ).
int64_t differing(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return std::max(a.numel(), b.numel());
  const Tensor ca = a.clone(), cb = b.clone();  // contiguous
  const size_t e = dtype_size(a.dtype());
  const char* pa = static_cast<const char*>(ca.raw());
  const char* pb = static_cast<const char*>(cb.raw());
  int64_t n = 0;
  for (int64_t i = 0; i < a.numel(); ++i) n += std::memcmp(pa + i * e, pb + i * e, e) != 0;
  return n;
}

void report(const std::string& name, double err, double tol) {
  const bool pass = err <= tol;  // false for NaN
  std::printf("GPUCHECK %s %.3e %.3e %s\n", name.c_str(), err, tol, pass ? "PASS" : "FAIL");
  std::fflush(stdout);
  EXPECT_LE(err, tol) << name;
}

// bf16's unit roundoff, 2^-8: rounding an f32 value to the nearest bf16 moves it by at most this
// fraction of itself. A bf16 output computed in f32 and rounded once is this far from the f32
// result, plus the f32 arithmetic's own error.
constexpr double kBf16U = 1.0 / 256;

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

// The same batches with bf16 in any of x, out and the state pool (the model's layers: bf16 x, out
// and pool). Inputs stored in bf16 are drawn as bf16 values, so the CPU twin sees exactly what the
// GPU reads; then
//  - out: an f32 out keeps the f32 bound above; a bf16 out is the GPU's f32 result rounded once,
//    at most kBf16U of each value away from it, so scaled error <= kBf16U + (W + 4) eps and the
//    relative L2 error <= kBf16U (+ the f32 part, ~1e-7);
//  - states: exact: an f32 pool as the CPU's, a bf16 pool as the CPU's rounded to nearest even (a
//    bf16 x leaves its own values, which round to themselves);
//  - each sequence alone through the same call: the same bits (out and state).
void run_conv_dtype_case(const ConvCase& k, DType x_dtype, DType out_dtype, DType pool_dtype) {
  const int64_t C = k.C, W = k.W, P = W - 1, B = static_cast<int64_t>(k.lens.size());
  const std::vector<int64_t> cu = cumulative(k.lens);
  const int64_t N = cu.back(), num_slots = B + 5;
  const std::vector<int32_t> slots = shuffled_ids(B, num_slots);
  Tensor x = randn({N, C}), pool0 = randn({num_slots, P, C});
  const Tensor w = randn({C, W}, 0.5f);
  if (x_dtype == DType::kBF16) x = bf16_rounded(x);
  if (pool_dtype == DType::kBF16) pool0 = bf16_rounded(pool0);
  const Tensor cu_h = i64_tensor(cu), slots_h = i32_tensor(slots, {B});
  const Tensor xd = dev(to_dtype(x, x_dtype)), wd = dev(w), cu_d = dev(cu_h),
               slots_d = dev(slots_h);
  const auto call = [&](const Tensor& xs, const Tensor& pool, const Tensor& sl, const Tensor& c,
                        bool silu, const Tensor& out) {
    if (k.rows_per_block == 0 && k.vec4) {
      causal_conv1d_varlen(gpu(), xs, wd, pool, sl, c, silu, out);
    } else {
      cuda::causal_conv1d_varlen_tuned(gpu(), xs, wd, pool, sl, c, silu, out, k.rows_per_block,
                                       k.vec4);
    }
  };
  for (bool silu : {false, true}) {
    const std::string tag = k.name + "_x" + dtype_tag(x_dtype) + "_out" + dtype_tag(out_dtype) +
                            "_state" + dtype_tag(pool_dtype) + (silu ? "_silu" : "");
    Tensor pool_ref = pool0.clone(), ref = Tensor::empty({N, C});
    causal_conv1d_varlen(host_exec(), x, w, pool_ref, slots_h, cu_h, silu, ref);

    const Tensor pool_d = dev(to_dtype(pool0, pool_dtype)), od = poisoned({N, C}, out_dtype);
    call(xd, pool_d, slots_d, cu_d, silu, od);
    const Tensor out = host_f32(od), out_raw = host(od), pool_raw = host(pool_d);
    const double f32_tol = (W + 4) * twin::kEps;
    const bool bf16_out = out_dtype == DType::kBF16;
    report("conv_varlen_" + tag, scaled_err(out, ref), bf16_out ? kBf16U + f32_tol : f32_tol);
    report("conv_varlen_rel_l2_" + tag, rel_l2(out, ref), bf16_out ? kBf16U + 1e-6 : f32_tol);
    report("conv_varlen_states_" + tag,
           static_cast<double>(differing(pool_raw, to_dtype(pool_ref, pool_dtype))), 0.0);

    int64_t alone = 0;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t T = k.lens[static_cast<size_t>(b)], s = slots[static_cast<size_t>(b)];
      if (T == 0) continue;
      const Tensor st = dev(to_dtype(pool0.slice(0, s, s + 1).clone(), pool_dtype));
      const Tensor o1 = poisoned({T, C}, out_dtype);
      call(xd.slice(0, cu[b], cu[b] + T), st, dev(i32_tensor({0}, {1})), dev(i64_tensor({0, T})),
           silu, o1);
      alone += differing(host(o1), out_raw.slice(0, cu[b], cu[b] + T));
      alone += differing(host(st), pool_raw.slice(0, s, s + 1));
    }
    report("conv_varlen_alone_" + tag, static_cast<double>(alone), 0.0);
  }
}

TEST_F(VarlenOpsCuda, CausalConv1dVarlenBf16) {
  constexpr DType F = DType::kF32, H = DType::kBF16;
  // Every combination on an odd channel count, the four-channel path with chunk boundaries inside
  // sequences' first W-1 rows and the any-width path.
  for (const ConvCase& k : std::vector<ConvCase>{{"C129_W4", 129, 4, mixed_lengths(), 0},
                                                 {"C256_W4_L3", 256, 4, mixed_lengths(), 3},
                                                 {"C68_W6", 68, 6, mixed_lengths(), 0}}) {
    for (DType xt : {F, H})
      for (DType ot : {F, H})
        for (DType pt : {F, H})
          if (xt == H || ot == H || pt == H) run_conv_dtype_case(k, xt, ot, pt);
  }
  // The model's combination (and bf16 activations over an f32 pool) on a decode batch, the scalar
  // path of a multiple-of-four width, the other compiled widths and a long prefill.
  for (const ConvCase& k :
       std::vector<ConvCase>{{"decode_B37_C132_W4", 132, 4, std::vector<int64_t>(37, 1), 0},
                             {"C256_W4_scalar_L5", 256, 4, mixed_lengths(), 5, false},
                             {"C67_W2_L3", 67, 2, mixed_lengths(), 3},
                             {"C68_W3", 68, 3, mixed_lengths(), 0},
                             {"prefill_T1000_C132_W4", 132, 4, {1000}, 0}}) {
    run_conv_dtype_case(k, H, H, H);
    run_conv_dtype_case(k, H, H, F);
  }
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
  const Tensor rows_f32 = randn(rows_shape);
  const Tensor pt = i32_tensor(table, {B, max_pages}), cu_h = i64_tensor(cu),
               past_h = i64_tensor(past);
  // f32 rows, then bf16 rows (the CPU twin writes their values in f32): every combination with an
  // f32 and a bf16 pool, each exact.
  for (DType rows_dtype : {DType::kF32, DType::kBF16}) {
    const Tensor rows = rows_dtype == DType::kBF16 ? bf16_rounded(rows_f32) : rows_f32;
    const std::string tag = name + (rows_dtype == DType::kBF16 ? "_bf16rows" : "");
    Tensor ref = pool0.clone();
    cache_write_varlen(host_exec(), ref, pt, cu_h, past_h, rows);
    const Tensor rows_d = dev(to_dtype(rows, rows_dtype));
    // An f32 pool: bf16 rows widen exactly, f32 rows are copied.
    Tensor pool_d = dev(pool0);
    cache_write_varlen(gpu(), pool_d, dev(pt), dev(cu_h), dev(past_h), rows_d);
    report("cache_write_varlen_" + tag, scaled_err(pool_d, ref), 0.0);

    // A bf16 pool (a bf16 KV cache): every element must be the CPU result rounded to nearest
    // even, bit for bit, the untouched history included (bf16 rows: a plain copy).
    Tensor pool_b = dev(to_dtype(pool0, DType::kBF16));
    cache_write_varlen(gpu(), pool_b, dev(pt), dev(cu_h), dev(past_h), rows_d);
    report("cache_write_varlen_bf16pool_" + tag,
           static_cast<double>(differing(host(pool_b), to_dtype(ref, DType::kBF16))), 0.0);
  }
}

TEST_F(VarlenOpsCuda, CacheWriteVarlen) {
  run_cache_case("row3x43_ps16", {3, 43}, 16);    // 129 floats: 4-byte units (bf16: 2-byte)
  run_cache_case("row64_ps16", {64}, 16);         // 16-byte units, 16 threads a row (bf16: 8)
  run_cache_case("row8x128_ps64", {8, 128}, 64);  // GQA-like, 32 threads a row
  run_cache_case("row5_ps7", {5}, 7);             // odd page size, 8 threads a row
  run_cache_case("row6_ps5", {6}, 5);             // bf16: 12 bytes, 4-byte units
}

// ---------------------------------------------------------------------------------------------
// attnres_aggregate with an f32 and a bf16 out (the model writes the normalised sublayer input in
// bf16; sources and weights stay f32). f32: tests/gpu/moe_cuda_test.cc's bound, scaled error <=
// (2 sqrt(D) + 16) eps (sums of squares and dot products of length D in different orders); bf16:
// that plus one rounding of the result (kBf16U), for the scaled and the relative L2 error alike.
TEST_F(VarlenOpsCuda, AttnResAggregateOutDtypes) {
  for (int64_t D : {37, 256, 1000, 2048, 5000}) {
    for (int64_t S : {1, 3, 5}) {
      const int64_t N = 37;
      Tensor src = randn({S, N, D});
      for (int64_t i = 0; i < S; ++i) {  // sources of different sizes, as block sums are
        const float scale = 0.5f + static_cast<float>(i);
        float* p = src.data<float>() + i * N * D;
        for (int64_t j = 0; j < N * D; ++j) p[j] *= scale;
      }
      const Tensor q = randn({D}, 2.0f / std::sqrt(static_cast<float>(D)));
      const Tensor kn = twin::randn(rng(), {D}, 0.2f, 1.0f),
                   on = twin::randn(rng(), {D}, 0.2f, 1.0f);
      Tensor ref = Tensor::empty({N, D});
      attnres_aggregate(host_exec(), src, q, kn, on, 1e-6f, ref);
      const double f32_tol = (2 * std::sqrt(static_cast<double>(D)) + 16) * twin::kEps;
      for (DType dt : {DType::kF32, DType::kBF16}) {
        const Tensor out = poisoned({N, D}, dt);
        attnres_aggregate(gpu(), dev(src), dev(q), dev(kn), dev(on), 1e-6f, out);
        const Tensor got = host_f32(out);
        const std::string tag = std::string("_out") + dtype_tag(dt) + "_S" + std::to_string(S) +
                                "_N37_D" + std::to_string(D);
        const double tol = (dt == DType::kBF16 ? kBf16U : 0.0) + f32_tol;
        report("attnres_aggregate" + tag, scaled_err(got, ref), tol);
        report("attnres_aggregate_rel_l2" + tag, rel_l2(got, ref), tol);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The KDA / Gated DeltaNet token recurrence with bf16 q, k, v and out (beta bf16 or f32; g and the
// states f32): kda_varlen_forward under batch-invariant numerics (every sequence takes the
// recurrence), for short prefills (max_seqlen <= kKdaRecurrentMaxTokens) and one-token decode
// steps, and kda_recurrent_forward on one sequence; a mixed batch through the public dispatch
// covers the chunked form too (tests/gpu/kda_chunked_cuda_test.cc tests it in depth).
// The bf16 inputs are drawn as bf16 values, so the CPU twin runs the same f32 recurrence on what
// the GPU reads. Bounds, relative L2 per sequence (per slot for states):
//  - recurrence: states 1e-4 (the f32 bound of kda_chunked_cuda_test.cc: the two sides sum the
//    same dot products in different orders, ~sqrt(dk) eps a token, not amplified over tokens
//    since each token's map is non-expansive: twin_tolerances.h's kda_tol), outputs that plus one
//    rounding to bf16 (kBf16U);
//  - the chunked form (mixed batch): 1e-2, kda_chunked_cuda_test.cc's bf16 bound (its products
//    take bf16 operands on tensor cores).
// Untouched slots must come back bit-identical. Batch invariance: under batch-invariant numerics
// each sequence alone (B = 1, its own slot) gives the batched call's bits, outputs and state.
struct KdaVarlenCase {
  std::string name;
  std::vector<int64_t> lens;
  int64_t Hk, Hv, dk, dv;
  bool scalar_g;  // GDN: one decay per head
  DType act, beta;
  bool batch_invariant;
  int64_t max_seqlen = 0;
};

struct KdaBatch {
  twin::KdaInputs in;  // host, f32 (bf16-rounded values where the case stores bf16)
  Tensor pool0, slots, cu;
  int64_t N = 0, B = 0, num_slots = 0;
};

KdaBatch kda_batch(const KdaVarlenCase& c) {
  KdaBatch k;
  k.B = static_cast<int64_t>(c.lens.size());
  const std::vector<int64_t> cu = cumulative(c.lens);
  k.N = cu.back();
  k.in = twin::kda_inputs(rng(), {k.N, c.Hk, c.Hv, c.dk, c.dv, c.scalar_g, /*softplus=*/false});
  if (c.act == DType::kBF16) {
    for (Tensor* t : {&k.in.q, &k.in.k, &k.in.v}) *t = bf16_rounded(*t);
  }
  if (c.beta == DType::kBF16) k.in.beta = bf16_rounded(k.in.beta);
  k.num_slots = k.B + 4;
  k.pool0 = randn({k.num_slots, c.Hv, c.dk, c.dv}, 0.1f);
  k.slots = i32_tensor(shuffled_ids(k.B, k.num_slots), {k.B});
  k.cu = i64_tensor(cu);
  return k;
}

// The batch's inputs on the GPU, in the case's dtypes.
struct KdaDevice {
  Tensor q, k, v, g, beta;
};

KdaDevice kda_device(const KdaBatch& k, const KdaVarlenCase& c) {
  return {dev(to_dtype(k.in.q, c.act)), dev(to_dtype(k.in.k, c.act)), dev(to_dtype(k.in.v, c.act)),
          dev(k.in.g), dev(to_dtype(k.in.beta, c.beta))};
}

void run_kda_varlen_case(const KdaVarlenCase& c) {
  const KdaBatch k = kda_batch(c);
  Exec cpu = host_exec();
  cpu.batch_invariant = c.batch_invariant;
  Tensor pool_ref = k.pool0.clone(), out_ref = Tensor::empty({k.N, c.Hv, c.dv});
  kda_varlen_forward(cpu, k.in.q, k.in.k, k.in.v, k.in.g, k.in.beta, k.in.scale, pool_ref, k.slots,
                     k.cu, out_ref, c.max_seqlen);

  Exec ex = gpu();
  ex.batch_invariant = c.batch_invariant;
  const KdaDevice d = kda_device(k, c);
  const Tensor pool_d = dev(k.pool0), out_d = poisoned({k.N, c.Hv, c.dv}, c.act);
  const Tensor slots_d = dev(k.slots), cu_d = dev(k.cu);
  kda_varlen_forward(ex, d.q, d.k, d.v, d.g, d.beta, k.in.scale, pool_d, slots_d, cu_d, out_d,
                     c.max_seqlen);
  const Tensor out_raw = host(out_d), out = out_raw.to_f32(), pool = host(pool_d);

  const int64_t* cu = k.cu.data<int64_t>();
  const int32_t* slots = k.slots.data<int32_t>();
  double out_l2 = 0.0, state_l2 = 0.0;
  std::vector<bool> named(static_cast<size_t>(k.num_slots), false);
  for (int64_t b = 0; b < k.B; ++b) {
    named[static_cast<size_t>(slots[b])] = true;
    if (cu[b + 1] > cu[b])
      out_l2 = std::max(out_l2, rel_l2(out.slice(0, cu[b], cu[b + 1]).clone(),
                                       out_ref.slice(0, cu[b], cu[b + 1]).clone()));
    state_l2 = std::max(state_l2,
                        rel_l2(pool.select(slots[b]).clone(), pool_ref.select(slots[b]).clone()));
  }
  int64_t untouched = 0;
  for (int64_t s = 0; s < k.num_slots; ++s)
    if (!named[static_cast<size_t>(s)]) untouched += differing(pool.select(s), k.pool0.select(s));
  const bool chunked =
      !c.batch_invariant && (c.max_seqlen == 0 || c.max_seqlen > kKdaRecurrentMaxTokens);
  const double state_tol = chunked ? 1e-2 : 1e-4;
  const double out_tol = chunked ? 1e-2 : (c.act == DType::kBF16 ? kBf16U : 0.0) + 1e-4;
  report(c.name + "_out_rel_l2", out_l2, out_tol);
  report(c.name + "_state_rel_l2", state_l2, state_tol);
  report(c.name + "_untouched_slots", static_cast<double>(untouched), 0.0);
  if (!c.batch_invariant) return;

  // Each sequence alone: its rows, its own slot, B = 1.
  int64_t alone = 0;
  for (int64_t b = 0; b < k.B; ++b) {
    const int64_t r0 = cu[b], r1 = cu[b + 1], s = slots[b];
    if (r1 == r0) continue;
    const Tensor p1 = dev(k.pool0.slice(0, s, s + 1).clone()),
                 o1 = poisoned({r1 - r0, c.Hv, c.dv}, c.act);
    kda_varlen_forward(ex, d.q.slice(0, r0, r1), d.k.slice(0, r0, r1), d.v.slice(0, r0, r1),
                       d.g.slice(0, r0, r1), d.beta.slice(0, r0, r1), k.in.scale, p1,
                       dev(i32_tensor({0}, {1})), dev(i64_tensor({0, r1 - r0})), o1, r1 - r0);
    alone += differing(host(o1), out_raw.slice(0, r0, r1));
    alone += differing(host(p1).select(0), pool.select(s));
  }
  report(c.name + "_alone_vs_batched", static_cast<double>(alone), 0.0);
}

TEST_F(VarlenOpsCuda, KdaRecurrenceBf16) {
  constexpr DType F = DType::kF32, H = DType::kBF16;
  const std::vector<int64_t> mix = {37, 1, 0, 9, 130, 2, 8}, few = {5, 70, 1};
  for (bool gdn : {false, true}) {
    const std::string kind = gdn ? "gdn" : "kda";
    // Batch-invariant: the recurrence for every sequence; bf16 with beta bf16 and f32, then f32.
    for (const auto& [act, beta] : {std::pair{H, H}, std::pair{H, F}, std::pair{F, F}}) {
      const std::string t = std::string("_") + dtype_tag(act) + "_beta" + dtype_tag(beta);
      run_kda_varlen_case(
          {kind + "_varlen_invariant_dk72_dv45" + t, mix, 2, 6, 72, 45, gdn, act, beta, true});
      run_kda_varlen_case(
          {kind + "_varlen_invariant_dk200_dv33" + t, few, 3, 3, 200, 33, gdn, act, beta, true});
    }
    // Short prefills (the recurrence alone), decode steps (the batched decode kernel) and a mixed
    // batch (recurrence and chunked form) through the default numerics, bf16.
    run_kda_varlen_case(
        {kind + "_varlen_short_bf16", {3, 8, 1, 5, 0, 7}, 2, 4, 64, 40, gdn, H, H, false, 8});
    run_kda_varlen_case({kind + "_varlen_decode_B19_bf16", std::vector<int64_t>(19, 1), 2, 6, 72,
                         45, gdn, H, F, false, 1});
    run_kda_varlen_case(
        {kind + "_varlen_mixed_bf16", {130, 1, 65, 7, 9}, 2, 4, 64, 64, gdn, H, H, false, 0});
  }
}

// kda_recurrent_forward (one sequence, state [Hv, dk, dv]) with f32 and bf16 activations, KDA and
// GDN, with the recurrence bounds above.
TEST_F(VarlenOpsCuda, KdaRecurrentForward) {
  constexpr DType F = DType::kF32, H = DType::kBF16;
  for (bool gdn : {false, true}) {
    for (const auto& [act, beta] : {std::pair{H, H}, std::pair{H, F}, std::pair{F, F}}) {
      const int64_t T = 77, Hk = 2, Hv = 6, dk = 100, dv = 37;
      twin::KdaInputs in = twin::kda_inputs(rng(), {T, Hk, Hv, dk, dv, gdn, /*softplus=*/true});
      if (act == H) {
        for (Tensor* t : {&in.q, &in.k, &in.v}) *t = bf16_rounded(*t);
      }
      if (beta == H) in.beta = bf16_rounded(in.beta);
      Tensor s_ref = in.s0.clone(), o_ref = Tensor::empty({T, Hv, dv});
      kda_recurrent_forward(host_exec(), in.q, in.k, in.v, in.g, in.beta, in.scale, s_ref, o_ref);
      const Tensor sd = dev(in.s0), od = poisoned({T, Hv, dv}, act);
      kda_recurrent_forward(gpu(), dev(to_dtype(in.q, act)), dev(to_dtype(in.k, act)),
                            dev(to_dtype(in.v, act)), dev(in.g), dev(to_dtype(in.beta, beta)),
                            in.scale, sd, od);
      const std::string name = std::string(gdn ? "gdn" : "kda") +
                               "_recurrent_forward_T77_dk100_dv37_" + dtype_tag(act) + "_beta" +
                               dtype_tag(beta);
      report(name + "_out_rel_l2", rel_l2(host_f32(od), o_ref), (act == H ? kBf16U : 0.0) + 1e-4);
      report(name + "_state_rel_l2", rel_l2(host(sd), s_ref), 1e-4);
    }
  }
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
