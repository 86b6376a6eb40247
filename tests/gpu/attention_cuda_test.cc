// The varlen attention ops on the GPU (gqa_attention_varlen, mla_attention_varlen,
// kernels/attention.h; kernels/cuda/attention.h) against their CPU twins, on fresh random inputs
// (the seed is printed; LOOM_GPU_TEST_SEED replays one).
//
// Batches mix decode rows over long contexts (which split their keys), short multi-row sequences
// that split too, prefill chunks with and without history and an empty sequence, in shuffled pages
// (page sizes 16 and 64) whose page-table padding names page 0 (a page another sequence owns, so
// a kernel reading past a sequence's pages gets wrong keys, not a fault). Head dims are odd or
// not multiples of the tiles where the path allows it (element loads, padded rows, head counts
// that leave tile rows empty or need several head tiles). Outputs are NaN before every call.
//
// Bounds (each check prints "GPUCHECK <name> <error> <bound> <PASS|FAIL>" for tests/gpu/run.sh),
// on the relative L2 error ||gpu - cpu|| / ||cpu|| of the whole output; the CPU twin reads the
// same pool values (a bf16 pool's values widened to f32), so the bounds measure the kernels:
//  - f32 arithmetic (f32 pools, and bf16 pools on CUDA cores): 1e-4. Both sides sum the same
//    products in different orders (the GPU online, per key tile, with MLA in absorbed form where
//    the CPU may take the expanded one), ~1e-6 apart; a dropped key of a 300-key context moves a
//    row by ~1/300;
//  - MLA on tensor cores (bf16 pools, R = 512, dr = 64; mma.sync or, on the H200 by default
//    where pages hold whole key tiles, TMA + wgmma): 1e-2. q and the softmax weights are
//    rounded to bf16 (relative 2^-9 each) for the products: ~1e-3. The wgmma kernel also runs
//    forced onto pages of 16 (every tile crosses pages: its copy path without TMA) and on decode
//    batches of 1, 3 and 37 rows whose contexts are not multiples of a tile or a page;
//  - bf16 q and out: 1e-2 (the output rounding alone is ~2e-3 relative).
// Splits: the tensor-core MLA paths size them by the batch in the default mode (one chunk size per
// call, chosen on the device for occupancy), so a sequence alone splits differently from the same
// sequence in a batch: each sequence alone is checked against the CPU twin there, and the
// per-length policy (AttentionTuning::split = 1) stays covered as a variant. GQA and the CUDA-core
// MLA path split by each sequence's length: bit-identical alone and batched in both modes.
// Batch invariance (batch-invariant mode, nothing splits): every sequence's rows alone (B = 1)
// equal its rows in the batch bit for bit, and a prefill split into two chunks equals the whole
// chunk bit for bit. MlaWgmmaRacecheck is a small case for compute-sanitizer's racecheck.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/workspace.h"
#include "kernels/attention.h"
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
// A device tensor of `dtype` full of NaN.
Tensor poisoned(Shape shape, DType dtype = DType::kF32) {
  const Tensor f = Tensor::full(shape, std::nanf(""));
  return dev(dtype == DType::kBF16 ? to_bf16(f) : f);
}

Tensor i64_tensor(const std::vector<int64_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI64);
  std::copy(v.begin(), v.end(), t.data<int64_t>());
  return t;
}

// ||got - ref|| / ||ref|| (host f32 ref; got on either side, f32 or bf16); infinite on NaN.
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
  const bool pass = err <= tol;  // false for NaN
  std::printf("GPUCHECK %s %.3e %.3e %s\n", name.c_str(), err, tol, pass ? "PASS" : "FAIL");
  std::fflush(stdout);
  EXPECT_LE(err, tol) << name;
}

// A varlen step: sequence b adds lens[b] rows after past[b] cached positions, its pages drawn
// from a shuffled pool; page-table columns past a sequence's pages name page 0.
struct Step {
  std::vector<int64_t> lens, past, cu;
  int64_t B = 0, N = 0, page_size = 0, max_pages = 0, num_pages = 0;
  Tensor table, cu_h, past_h;  // host
  Tensor table_d, cu_d, past_d;

  // Sequence b alone (its own page-table row).
  Step alone(int64_t b) const {
    Step s;
    s.lens = {lens[b]};
    s.past = {past[b]};
    s.cu = {0, lens[b]};
    s.B = 1;
    s.N = lens[b];
    s.page_size = page_size;
    s.max_pages = max_pages;
    s.num_pages = num_pages;
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

// min_cols: page-table columns at least (the padding names page 0).
Step make_step(const std::vector<int64_t>& lens, const std::vector<int64_t>& past,
               int64_t page_size, int64_t min_cols = 0) {
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
  s.max_pages = std::max(s.max_pages + 1, min_cols);  // a padding column in every row
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

// The mixed batch of most cases: decode rows over long and short contexts, short multi-row
// sequences over long contexts (split), prefill chunks with and without history, an empty one.
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

// ---------------------------------------------------------------------------------------------
// GQA.
struct GqaCase {
  std::string name;
  int64_t hq, hkv, d, dv, page_size;
  DType pool = DType::kF32, act = DType::kF32;
  cuda::AttentionTuning tuning;
  double tol = 1e-4;
};

struct GqaInputs {
  Tensor q, k, v;     // host f32 (k, v: the pool values the CPU reads)
  Tensor qd, kd, vd;  // device, in the case's dtypes
  float scale;
};

GqaInputs gqa_inputs(const GqaCase& c, const Step& s) {
  GqaInputs in;
  in.q = randn({s.N, c.hq, c.d});
  in.k = randn({s.num_pages, s.page_size, c.hkv, c.d});
  in.v = randn({s.num_pages, s.page_size, c.hkv, c.dv});
  if (c.pool == DType::kBF16) {
    const Tensor kb = to_bf16(in.k), vb = to_bf16(in.v);
    in.k = kb.to_f32();
    in.v = vb.to_f32();
    in.kd = dev(kb);
    in.vd = dev(vb);
  } else {
    in.kd = dev(in.k);
    in.vd = dev(in.v);
  }
  if (c.act == DType::kBF16) {
    const Tensor qb = to_bf16(in.q);
    in.q = qb.to_f32();
    in.qd = dev(qb);
  } else {
    in.qd = dev(in.q);
  }
  in.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  return in;
}

Tensor gqa_gpu(const Exec& ex, const GqaCase& c, const GqaInputs& in, const Step& s,
               const Tensor& q) {
  const Tensor out = poisoned({s.N, c.hq, c.dv}, c.act);
  cuda::gqa_attention_varlen_tuned(ex, q, in.kd, in.vd, s.table_d, s.cu_d, s.past_d, in.scale, out,
                                   c.tuning);
  return out;
}

void run_gqa(const GqaCase& c, const Step& s) {
  const GqaInputs in = gqa_inputs(c, s);
  Tensor ref = Tensor::empty({s.N, c.hq, c.dv});
  gqa_attention_varlen(host_exec(), in.q, in.k, in.v, s.table, s.cu_h, s.past_h, in.scale, ref);
  {
    const Tensor o = poisoned({s.N, c.hq, c.dv}, c.act);
    if (c.tuning.gqa_qpw == 0 && c.tuning.max_splits == 0 && c.tuning.min_chunk == 0) {
      gqa_attention_varlen(gpu(), in.qd, in.kd, in.vd, s.table_d, s.cu_d, s.past_d, in.scale, o);
    } else {
      cuda::gqa_attention_varlen_tuned(gpu(), in.qd, in.kd, in.vd, s.table_d, s.cu_d, s.past_d,
                                       in.scale, o, c.tuning);
    }
    report("gqa_" + c.name, rel_l2(o, ref), c.tol);
  }
  const Tensor o2 = gqa_gpu(gpu_invariant(), c, in, s, in.qd);
  report("gqa_" + c.name + "_invariant_mode", rel_l2(o2, ref), c.tol);
}

std::vector<GqaCase> gqa_cases() {
  return {
      {"h6x2_d40_dv36_ps16", 6, 2, 40, 36, 16},
      {"h6x2_d43_dv29_ps64_elementwise", 6, 2, 43, 29, 64},
      {"h6x2_d40_dv36_ps16_qpw1", 6, 2, 40, 36, 16, DType::kF32, DType::kF32, {.gqa_qpw = 1}},
      {"h6x2_d40_dv36_ps16_qpw4", 6, 2, 40, 36, 16, DType::kF32, DType::kF32, {.gqa_qpw = 4}},
      {"h40x1_d24_dv200_ps16_headtiles", 40, 1, 24, 200, 16},
      {"h32x8_d128_ps64_bf16pool", 32, 8, 128, 128, 64, DType::kBF16},
      {"h12x4_d64_ps16_bf16pool_bf16act", 12, 4, 64, 64, 16, DType::kBF16, DType::kBF16, {}, 1e-2},
      {"h5x5_d33_dv17_ps16_bf16pool_elementwise", 5, 5, 33, 17, 16, DType::kBF16},
      {"h6x2_d40_dv36_ps16_nosplit", 6, 2, 40, 36, 16, DType::kF32, DType::kF32, {.max_splits = 1}},
      {"h6x2_d40_dv36_ps16_chunk64", 6, 2, 40, 36, 16, DType::kF32, DType::kF32, {.min_chunk = 64}},
  };
}

TEST(AttentionCuda, GqaVarlen) {
  cuda::init();
  const std::vector<GqaCase> cases = gqa_cases();
  for (const GqaCase& c : cases) run_gqa(c, mixed_step(c.page_size));
  // A pure decode batch and one long prefill.
  run_gqa(cases[5],
          make_step(std::vector<int64_t>(9, 1), {5000, 1, 31, 64, 4097, 700, 2, 129, 1500}, 64));
  run_gqa(cases[0], make_step({700}, {90}, 16));
}

// ---------------------------------------------------------------------------------------------
// MLA.
struct MlaCase {
  std::string name;
  MlaDims dims;
  int64_t page_size;
  DType pool = DType::kF32, act = DType::kF32;
  cuda::AttentionTuning tuning;
  double tol = 1e-4;
};

struct MlaInputs {
  Tensor q, latent, rope, kv_b;  // host f32
  Tensor qd, latent_d, rope_d, kv_b_d;
  float scale;
};

MlaInputs mla_inputs(const MlaCase& c, const Step& s) {
  const MlaDims& m = c.dims;
  MlaInputs in;
  in.q = randn({s.N, m.heads, m.nope_dim + m.rope_dim});
  in.latent = randn({s.num_pages, s.page_size, m.latent_dim});
  // dr = 0: a one-column rope pool that no side reads.
  in.rope = randn({s.num_pages, s.page_size, std::max<int64_t>(m.rope_dim, 1)});
  in.kv_b = randn({m.heads * (m.nope_dim + m.v_dim), m.latent_dim},
                  1.0f / std::sqrt(static_cast<float>(m.latent_dim)));
  if (c.pool == DType::kBF16) {
    const Tensor lb = to_bf16(in.latent), rb = to_bf16(in.rope);
    in.latent = lb.to_f32();
    in.rope = rb.to_f32();
    in.latent_d = dev(lb);
    in.rope_d = dev(rb);
  } else {
    in.latent_d = dev(in.latent);
    in.rope_d = dev(in.rope);
  }
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

Tensor mla_gpu(const Exec& ex, const MlaCase& c, const MlaInputs& in, const Step& s) {
  const Tensor out = poisoned({s.N, c.dims.heads, c.dims.v_dim}, c.act);
  cuda::mla_attention_varlen_tuned(ex, in.qd, in.latent_d, in.rope_d, s.table_d, s.cu_d, s.past_d,
                                   in.kv_b_d, c.dims, in.scale, out, c.tuning);
  return out;
}

void run_mla(const MlaCase& c, const Step& s) {
  const MlaInputs in = mla_inputs(c, s);
  Tensor ref = Tensor::empty({s.N, c.dims.heads, c.dims.v_dim});
  mla_attention_varlen(host_exec(), in.q, in.latent, in.rope, s.table, s.cu_h, s.past_h, in.kv_b,
                       c.dims, in.scale, ref);
  {
    const Tensor o = poisoned({s.N, c.dims.heads, c.dims.v_dim}, c.act);
    if (c.tuning.mla_path == 0 && c.tuning.max_splits == 0 && c.tuning.tc_keys == 0 &&
        c.tuning.min_chunk == 0 && c.tuning.split == 0) {
      mla_attention_varlen(gpu(), in.qd, in.latent_d, in.rope_d, s.table_d, s.cu_d, s.past_d,
                           in.kv_b_d, c.dims, in.scale, o);
    } else {
      cuda::mla_attention_varlen_tuned(gpu(), in.qd, in.latent_d, in.rope_d, s.table_d, s.cu_d,
                                       s.past_d, in.kv_b_d, c.dims, in.scale, o, c.tuning);
    }
    report("mla_" + c.name, rel_l2(o, ref), c.tol);
  }
  report("mla_" + c.name + "_invariant_mode", rel_l2(mla_gpu(gpu_invariant(), c, in, s), ref),
         c.tol);
}

const MlaDims kDeepSeek{32, 128, 64, 128, 512};

std::vector<MlaCase> mla_cases() {
  cuda::AttentionTuning simt;
  simt.mla_path = 1;
  const cuda::AttentionTuning mma{.mla_path = 2}, wgmma{.mla_path = 3};
  return {
      {"h3_dn12_dr6_dv10_r20_ps16", {3, 12, 6, 10, 20}, 16},
      {"h3_dn12_dr0_dv10_r20_ps16", {3, 12, 0, 10, 20}, 16},
      {"h5_dn16_dr8_dv12_r36_ps64_bf16pool_elementwise", {5, 16, 8, 12, 36}, 64, DType::kBF16},
      {"h8_dn32_dr64_dv32_r512_ps64", {8, 32, 64, 32, 512}, 64},
      {"deepseek_h32_ps64_bf16pool_tc", kDeepSeek, 64, DType::kBF16, DType::kF32, {}, 1e-2},
      {"deepseek_h32_ps64_bf16pool_simt", kDeepSeek, 64, DType::kBF16, DType::kF32, simt},
      {"h20_ps16_bf16pool_tc", {20, 64, 64, 48, 512}, 16, DType::kBF16, DType::kF32, {}, 1e-2},
      {"h40_ps16_bf16pool_tc_headtiles",
       {40, 32, 64, 32, 512},
       16,
       DType::kBF16,
       DType::kF32,
       {},
       1e-2},
      {"deepseek_h32_ps16_bf16pool_tc_k32s4",
       kDeepSeek,
       16,
       DType::kBF16,
       DType::kF32,
       {.tc_keys = 32, .tc_stages = 4},
       1e-2},
      {"deepseek_h32_ps64_bf16pool_tc_k32s3_chunk128",
       kDeepSeek,
       64,
       DType::kBF16,
       DType::kF32,
       {.min_chunk = 128, .tc_keys = 32, .tc_stages = 3},
       1e-2},
      {"deepseek_h32_ps64_bf16pool_bf16act", kDeepSeek, 64, DType::kBF16, DType::kBF16, {}, 1e-2},
      {"h3_dn12_dr6_dv10_r20_ps16_nosplit",
       {3, 12, 6, 10, 20},
       16,
       DType::kF32,
       DType::kF32,
       {.max_splits = 1}},
      {"deepseek_h32_ps64_bf16pool_mma", kDeepSeek, 64, DType::kBF16, DType::kF32, mma, 1e-2},
      {"deepseek_h32_ps64_bf16pool_wgmma", kDeepSeek, 64, DType::kBF16, DType::kF32, wgmma, 1e-2},
      {"deepseek_h32_ps16_bf16pool_wgmma", kDeepSeek, 16, DType::kBF16, DType::kF32, wgmma, 1e-2},
      {"deepseek_h32_ps128_bf16pool_wgmma_k32",
       kDeepSeek,
       128,
       DType::kBF16,
       DType::kF32,
       {.mla_path = 3, .tc_keys = 32},
       1e-2},
      {"h20_ps64_bf16pool_wgmma",
       {20, 64, 64, 48, 512},
       64,
       DType::kBF16,
       DType::kF32,
       wgmma,
       1e-2},
      {"h40_ps64_bf16pool_wgmma_headtiles",
       {40, 32, 64, 32, 512},
       64,
       DType::kBF16,
       DType::kF32,
       wgmma,
       1e-2},
      {"deepseek_h32_ps64_bf16pool_wgmma_chunk128",
       kDeepSeek,
       64,
       DType::kBF16,
       DType::kF32,
       {.mla_path = 3, .min_chunk = 128},
       1e-2},
      {"deepseek_h32_ps64_bf16pool_wgmma_perlen",
       kDeepSeek,
       64,
       DType::kBF16,
       DType::kF32,
       {.mla_path = 3, .split = 1},
       1e-2},
      {"deepseek_h32_ps16_bf16pool_mma_perlen",
       kDeepSeek,
       16,
       DType::kBF16,
       DType::kF32,
       {.mla_path = 2, .split = 1},
       1e-2},
  };
}

TEST(AttentionCuda, MlaVarlen) {
  cuda::init();
  const std::vector<MlaCase> cases = mla_cases();
  for (const MlaCase& c : cases) run_mla(c, mixed_step(c.page_size));
  // A pure decode batch over long contexts and a single prefill.
  run_mla(cases[4], make_step(std::vector<int64_t>(7, 1), {9000, 1, 63, 64, 4097, 1025, 2}, 64));
  run_mla(cases[3], make_step({300}, {90}, 64));
}

// MLA's expanded form (long prefill chunks; kernels/cuda/attention.h) against the CPU: with the
// host lens the default picks it per sequence (chunks of >= 128 rows where it is cheaper) and
// runs the rest absorbed in sub-batches, wherever they sit in the batch; forced for every
// sequence (decode rows too), with key blocks far smaller than a chunk (block edges inside the
// query tiles), f32 and bf16 activations, pages of 16 and 64 keys.
TEST(AttentionCuda, MlaExpandedForm) {
  cuda::init();
  const std::vector<int64_t> lens = {1, 300, 7, 1000, 129, 200, 1, 0, 131};
  const std::vector<int64_t> past = {3000, 0, 40, 777, 5000, 50, 0, 9, 1};
  struct Variant {
    std::string name;
    int64_t page_size;
    DType act;
    cuda::AttentionTuning tuning;
  };
  const std::vector<Variant> variants = {
      {"default_ps64_f32", 64, DType::kF32, {}},
      {"default_ps16_bf16act", 16, DType::kBF16, {}},
      {"forced_ps64_bf16act_block200", 64, DType::kBF16, {.mla_form = 2, .mla_key_block = 200}},
      {"forced_ps16_f32_block64", 16, DType::kF32, {.mla_form = 2, .mla_key_block = 64}},
  };
  for (const Variant& v : variants) {
    for (int order = 0; order < 2; ++order) {
      std::vector<int64_t> l = lens, p = past;
      if (order == 1) {  // another arrangement of expanded and absorbed runs
        std::reverse(l.begin(), l.end());
        std::reverse(p.begin(), p.end());
      }
      const Step s = make_step(l, p, v.page_size);
      MlaCase c{v.name, kDeepSeek, v.page_size, DType::kBF16, v.act, v.tuning, 1e-2};
      const MlaInputs in = mla_inputs(c, s);
      Tensor ref = Tensor::empty({s.N, c.dims.heads, c.dims.v_dim});
      mla_attention_varlen(host_exec(), in.q, in.latent, in.rope, s.table, s.cu_h, s.past_h,
                           in.kv_b, c.dims, in.scale, ref);
      const VarlenHostLens lens_h{s.cu_h.data<int64_t>(), s.past_h.data<int64_t>()};
      // The sequences that must take the expanded form (the rest run absorbed).
      uint64_t want = 0;
      for (int64_t b = 0; b < s.B; ++b) {
        const int64_t T = s.lens[b];
        want +=
            T > 0 && (v.tuning.mla_form == 2 ||
                      (T >= cuda::kMlaExpandedMinRows &&
                       mla_attention_form(T, s.past[b] + T, c.dims, false) == MlaForm::kExpanded));
      }
      ASSERT_GT(want, 0u) << v.name;
      // Through a step workspace, as the engine runs it: the first call overflows it (fresh
      // allocations), reset() grows it to the high-water mark, the second carves every buffer
      // out of the block (the sub-batches' regions released and reused by the expanded part).
      Workspace ws(Device::kCuda);
      Exec ex = gpu();
      ex.workspace = &ws;
      const uint64_t before = cuda::mla_expanded_sequences_run();
      const Tensor o = poisoned({s.N, c.dims.heads, c.dims.v_dim}, c.act);
      cuda::mla_attention_varlen_tuned(ex, in.qd, in.latent_d, in.rope_d, s.table_d, s.cu_d,
                                       s.past_d, in.kv_b_d, c.dims, in.scale, o, c.tuning, lens_h);
      EXPECT_EQ(cuda::mla_expanded_sequences_run() - before, want) << v.name;
      report("mla_expanded_" + v.name + "_order" + std::to_string(order), rel_l2(o, ref), c.tol);
      cuda::synchronize();
      ws.reset();
      const uint64_t overflows = ws.overflow_allocations();
      const Tensor o2 = poisoned({s.N, c.dims.heads, c.dims.v_dim}, c.act);
      cuda::mla_attention_varlen_tuned(ex, in.qd, in.latent_d, in.rope_d, s.table_d, s.cu_d,
                                       s.past_d, in.kv_b_d, c.dims, in.scale, o2, c.tuning, lens_h);
      EXPECT_EQ(ws.overflow_allocations(), overflows)
          << v.name << ": the second call fits the grown workspace";
      EXPECT_TRUE(bit_equal(host(o2), host(o))) << v.name << ": the same bits from the workspace";
      // Each sequence alone (its rows' error, so that one sequence's mistake cannot hide in the
      // batch's norm).
      const Tensor oh = host(o).to_f32();
      for (int64_t b = 0; b < s.B; ++b) {
        if (s.lens[b] == 0) continue;
        const double err = rel_l2(oh.slice(0, s.cu[b], s.cu[b + 1]).clone(),
                                  ref.slice(0, s.cu[b], s.cu[b + 1]).clone());
        EXPECT_LE(err, c.tol) << v.name << " order " << order << " sequence " << b << " ("
                              << s.lens[b] << " rows after " << s.past[b] << ")";
      }
    }
  }
}

// Decode batches for the tensor-core kernels at lengths that are not multiples of a key tile or
// a page: batch 1, 3, 37 (contexts 1..~2600) and 40 (a wide page table), split by the batch
// (default), by each length, and not.
TEST(AttentionCuda, MlaDecodeAwkward) {
  cuda::init();
  std::vector<int64_t> past37(37);
  std::uniform_int_distribution<int64_t> len(0, 2600);
  for (int64_t& p : past37) p = len(rng());
  std::vector<int64_t> past40(40);
  std::uniform_int_distribution<int64_t> short_len(0, 700);
  for (int64_t& p : past40) p = short_len(rng());
  const std::vector<std::pair<std::string, Step>> steps = {
      {"b1", make_step({1}, {4998}, 64)},
      {"b3", make_step({1, 1, 1}, {1000, 64, 130}, 64)},
      {"b37", make_step(std::vector<int64_t>(37, 1), past37, 64)},
      // A page table of 200 columns (12,800 keys): the workspace's partial slots are capped by
      // the machine (16 waves of items) below 40 rows x 128 splits.
      {"b40_wide", make_step(std::vector<int64_t>(40, 1), past40, 64, 200)},
  };
  for (const auto& [name, s] : steps) {
    for (const MlaCase& c : std::vector<MlaCase>{
             {"deepseek_decode_" + name + "_wgmma",
              kDeepSeek,
              64,
              DType::kBF16,
              DType::kF32,
              {.mla_path = 3},
              1e-2},
             {"deepseek_decode_" + name + "_wgmma_k32",
              kDeepSeek,
              64,
              DType::kBF16,
              DType::kF32,
              {.mla_path = 3, .tc_keys = 32},
              1e-2},
             {"deepseek_decode_" + name + "_wgmma_perlen",
              kDeepSeek,
              64,
              DType::kBF16,
              DType::kF32,
              {.mla_path = 3, .split = 1},
              1e-2},
             {"deepseek_decode_" + name + "_wgmma_nosplit",
              kDeepSeek,
              64,
              DType::kBF16,
              DType::kF32,
              {.mla_path = 3, .max_splits = 1},
              1e-2},
             {"deepseek_decode_" + name + "_mma",
              kDeepSeek,
              64,
              DType::kBF16,
              DType::kF32,
              {.mla_path = 2},
              1e-2},
         })
      run_mla(c, s);
  }
}

// ---------------------------------------------------------------------------------------------
// Batch invariance: a sequence's rows alone equal its rows in the batch, bit for bit; in
// batch-invariant mode also across prefill chunking.

// Runs `op` on the step and on each sequence alone; reports the largest relative L2 difference
// (0 when bit-identical).
template <class Op>
void check_alone(const std::string& name, const Step& s, const Op& op) {
  const Tensor all = host(op(s));
  bool same = true;
  for (int64_t b = 0; b < s.B; ++b) {
    if (s.lens[b] == 0) continue;
    const Tensor one = host(op(s.alone(b)));
    same = same && bit_equal(one, all.slice(0, s.cu[b], s.cu[b + 1]).clone());
  }
  report(name, same ? 0.0 : 1.0, 0.0);
}

// Runs `op` on each sequence alone and compares its rows with `ref`, the CPU twin's output for
// the whole step; reports the worst relative L2 error of a sequence.
template <class Op>
void check_alone_twin(const std::string& name, const Step& s, const Tensor& ref, double tol,
                      const Op& op) {
  double worst = 0.0;
  for (int64_t b = 0; b < s.B; ++b) {
    if (s.lens[b] == 0) continue;
    worst = std::max(worst, rel_l2(op(s.alone(b)), ref.slice(0, s.cu[b], s.cu[b + 1]).clone()));
  }
  report(name, worst, tol);
}

Tensor mla_cpu(const MlaCase& c, const MlaInputs& in, const Step& s) {
  Tensor ref = Tensor::empty({s.N, c.dims.heads, c.dims.v_dim});
  mla_attention_varlen(host_exec(), in.q, in.latent, in.rope, s.table, s.cu_h, s.past_h, in.kv_b,
                       c.dims, in.scale, ref);
  return ref;
}

// Splits sequence b's rows at `at` into two calls (the second with at more cached positions) and
// compares with the whole chunk.
template <class Op>
void check_chunked(const std::string& name, const Step& s, int64_t b, int64_t at, const Op& op) {
  const Step one = s.alone(b);
  const Tensor whole = host(op(one));
  Step first = one, second = one;
  first.lens = {at};
  first.cu = {0, at};
  first.N = at;
  first.finish();
  second.lens = {one.N - at};
  second.past = {one.past[0] + at};
  second.cu = {0, one.N - at};
  second.N = one.N - at;
  second.finish();
  const Tensor a = host(op(first)), c = host(op(second));
  const bool same = bit_equal(a, whole.slice(0, 0, at).clone()) &&
                    bit_equal(c, whole.slice(0, at, one.N).clone());
  report(name, same ? 0.0 : 1.0, 0.0);
}

TEST(AttentionCuda, BatchInvariance) {
  cuda::init();
  const Step s = mixed_step(16);
  int64_t prefill = 0;  // a sequence with many rows, for the chunking check
  for (int64_t b = 0; b < s.B; ++b)
    if (s.lens[b] > s.lens[prefill]) prefill = b;

  const GqaCase g{"h6x2_d40_dv36", 6, 2, 40, 36, 16};
  const GqaInputs gi = gqa_inputs(g, s);
  const MlaCase tc{"deepseek_tc", kDeepSeek, 16, DType::kBF16};
  const MlaInputs ti = mla_inputs(tc, s);
  MlaCase wg = tc;
  wg.tuning.mla_path = 3;
  MlaCase sm{"small_simt", {3, 12, 6, 10, 20}, 16};
  const MlaInputs si = mla_inputs(sm, s);
  const Tensor ref_t = mla_cpu(tc, ti, s);

  for (bool invariant : {false, true}) {
    const Exec ex = invariant ? gpu_invariant() : gpu();
    const std::string mode = invariant ? "_invariant_mode" : "";
    // The ops read q rows [cu[b], cu[b+1]) of the full batch: slice q to the call's rows.
    auto q_rows = [&](const Tensor& qd, const Step& sub, const Step& full) {
      if (sub.B == full.B) return qd;
      // Locate the rows of sub within full: sequence with the same page-table row.
      for (int64_t b = 0; b < full.B; ++b) {
        if (std::memcmp(sub.table.raw(), full.table.slice(0, b, b + 1).clone().raw(),
                        sub.table.nbytes()) != 0)
          continue;
        const int64_t r0 = full.cu[b] + (sub.past[0] - full.past[b]);
        return qd.slice(0, r0, r0 + sub.N);
      }
      return Tensor();
    };
    auto gqa_op = [&](const Step& sub) {
      const Tensor out = poisoned({sub.N, g.hq, g.dv});
      gqa_attention_varlen(ex, q_rows(gi.qd, sub, s), gi.kd, gi.vd, sub.table_d, sub.cu_d,
                           sub.past_d, gi.scale, out);
      return out;
    };
    auto mla_op = [&](const MlaCase& c, const MlaInputs& inputs) {
      const MlaInputs* in = &inputs;
      return [&, c, in](const Step& sub) {
        const Tensor out = poisoned({sub.N, c.dims.heads, c.dims.v_dim});
        cuda::mla_attention_varlen_tuned(ex, q_rows(in->qd, sub, s), in->latent_d, in->rope_d,
                                         sub.table_d, sub.cu_d, sub.past_d, in->kv_b_d, c.dims,
                                         in->scale, out, c.tuning);
        return out;
      };
    };
    // GQA and the CUDA-core MLA path split by each sequence's length: invariant in both modes.
    check_alone("batch_invariance_gqa_alone" + mode, s, gqa_op);
    check_alone("batch_invariance_mla_simt_alone" + mode, s, mla_op(sm, si));
    if (invariant) {
      check_alone("batch_invariance_mla_tc_alone" + mode, s, mla_op(tc, ti));
      check_alone("batch_invariance_mla_wgmma_ps16_alone" + mode, s, mla_op(wg, ti));
    } else {  // split by the batch: each sequence alone against the CPU twin
      check_alone_twin("mla_tc_alone_vs_cpu", s, ref_t, 1e-2, mla_op(tc, ti));
      check_alone_twin("mla_wgmma_ps16_alone_vs_cpu", s, ref_t, 1e-2, mla_op(wg, ti));
    }
    if (invariant) {
      const int64_t at = s.lens[prefill] / 3;
      check_chunked("batch_invariance_gqa_chunked" + mode, s, prefill, at, gqa_op);
      check_chunked("batch_invariance_mla_tc_chunked" + mode, s, prefill, at, mla_op(tc, ti));
      check_chunked("batch_invariance_mla_simt_chunked" + mode, s, prefill, at, mla_op(sm, si));
      check_chunked("batch_invariance_mla_wgmma_ps16_chunked" + mode, s, prefill, at,
                    mla_op(wg, ti));
    }
  }
}

// The same for the wgmma kernel where its tiles are TMA boxes (pages of 64): a mixed batch and
// a decode batch of 37 rows, each sequence alone against the batch, bit for bit in batch-invariant
// mode; against the CPU twin in the default mode (split by the batch).
TEST(AttentionCuda, MlaWgmmaBatchInvariance) {
  cuda::init();
  std::vector<int64_t> past37(37);
  std::uniform_int_distribution<int64_t> len(0, 3000);
  for (int64_t& p : past37) p = len(rng());
  for (const Step& s : {mixed_step(64), make_step(std::vector<int64_t>(37, 1), past37, 64)}) {
    for (int keys : {64, 32}) {
      const MlaCase c{"deepseek_wgmma", kDeepSeek,   64,
                      DType::kBF16,     DType::kF32, {.mla_path = 3, .tc_keys = keys}};
      const MlaInputs in = mla_inputs(c, s);
      const Tensor ref = mla_cpu(c, in, s);
      for (bool invariant : {false, true}) {
        const Exec ex = invariant ? gpu_invariant() : gpu();
        // Sequence b alone reads q rows [cu[b], cu[b + 1]) of the batch's q.
        const auto op = [&](const Step& sub) {
          int64_t r0 = 0;
          if (sub.B != s.B) {
            for (int64_t b = 0; b < s.B; ++b)
              if (std::memcmp(sub.table.raw(), s.table.slice(0, b, b + 1).clone().raw(),
                              sub.table.nbytes()) == 0)
                r0 = s.cu[b];
          }
          const Tensor out = poisoned({sub.N, c.dims.heads, c.dims.v_dim});
          cuda::mla_attention_varlen_tuned(ex, in.qd.slice(0, r0, r0 + sub.N), in.latent_d,
                                           in.rope_d, sub.table_d, sub.cu_d, sub.past_d, in.kv_b_d,
                                           c.dims, in.scale, out, c.tuning);
          return out;
        };
        const std::string name = "mla_wgmma_k" + std::to_string(keys) + "_B" + std::to_string(s.B);
        if (invariant) {
          check_alone("batch_invariance_" + name + "_alone_invariant_mode", s, op);
        } else {
          check_alone_twin(name + "_alone_vs_cpu", s, ref, 1e-2, op);
        }
      }
    }
  }
}

// A small decode step on the wgmma kernel (a few units of a few tiles) for compute-sanitizer's
// racecheck: split by the batch, by 64-key chunks and not at all, against the CPU twin.
TEST(AttentionCuda, MlaWgmmaRacecheck) {
  cuda::init();
  const Step s = make_step({1, 1}, {299, 189}, 64);
  for (const MlaCase& c : std::vector<MlaCase>{
           {"racecheck_wgmma", kDeepSeek, 64, DType::kBF16, DType::kF32, {.mla_path = 3}, 1e-2},
           {"racecheck_wgmma_chunk64",
            kDeepSeek,
            64,
            DType::kBF16,
            DType::kF32,
            {.mla_path = 3, .min_chunk = 64},
            1e-2},
           {"racecheck_wgmma_nosplit",
            kDeepSeek,
            64,
            DType::kBF16,
            DType::kF32,
            {.mla_path = 3, .max_splits = 1},
            1e-2},
       })
    run_mla(c, s);
}

// The same cases with both sides of the wgmma kernel's P handoff on bar.sync: racecheck reports
// hazards at the handoff with bar.arrive on the producer side and none here, which tells a tool
// that does not follow bar.arrive from a race (the two forms order the same accesses in PTX).
TEST(AttentionCuda, MlaWgmmaRacecheckSyncHandoff) {
  cuda::init();
  const Step s = make_step({1, 1}, {299, 189}, 64);
  for (const MlaCase& c : std::vector<MlaCase>{
           {"racecheck_wgmma_sync",
            kDeepSeek,
            64,
            DType::kBF16,
            DType::kF32,
            {.mla_path = 3, .sync_handoff = true},
            1e-2},
           {"racecheck_wgmma_sync_chunk64",
            kDeepSeek,
            64,
            DType::kBF16,
            DType::kF32,
            {.mla_path = 3, .min_chunk = 64, .sync_handoff = true},
            1e-2},
       })
    run_mla(c, s);
  // More units than resident blocks: each block runs several units back to back, so the
  // handoff's barriers must balance per unit (a pending one would hang the kernel).
  run_mla({"wgmma_sync_many_units",
           kDeepSeek,
           64,
           DType::kBF16,
           DType::kF32,
           {.mla_path = 3, .min_chunk = 64, .sync_handoff = true},
           1e-2},
          make_step(std::vector<int64_t>(40, 1), std::vector<int64_t>(40, 1000), 64));
}

// Every GQA and MLA case of GqaVarlen and MlaVarlen (each kernel path, split and tuning, both
// numerics modes) on one small step, for compute-sanitizer's racecheck, which does not finish the
// full-size tests: decode rows, a multi-row chunk over history split in 64-key chunks, a prefill
// without history and an empty sequence.
TEST(AttentionCuda, RacecheckSmallSteps) {
  cuda::init();
  for (const GqaCase& c : gqa_cases())
    run_gqa(c, make_step({1, 5, 17, 0, 1}, {40, 130, 0, 9, 200}, c.page_size));
  for (const MlaCase& c : mla_cases())
    run_mla(c, make_step({1, 5, 17, 0, 1}, {40, 130, 0, 9, 200}, c.page_size));
}

// Shapes and dtypes the CUDA twins refuse, with a message naming the op. Death tests re-execute
// the binary ("threadsafe" style): a forked child cannot use the parent's CUDA context.
TEST(AttentionCudaDeathTest, ChecksAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  cuda::init();
  const Step s = make_step({2}, {3}, 16);
  const Tensor q = dev(randn({2, 4, 8})), k = dev(randn({s.num_pages, 16, 2, 8}));
  const Tensor out = dev(randn({2, 4, 8}));
  const Tensor k16 = Tensor::empty({s.num_pages, 16, 2, 8}, DType::kI32, Device::kCuda);
  EXPECT_DEATH(gqa_attention_varlen(gpu(), q, k16, k16, s.table_d, s.cu_d, s.past_d, 1.0f, out),
               "gqa_attention_varlen");
  const Tensor q16 = Tensor::empty({2, 4, 8}, DType::kBF16, Device::kCuda);
  EXPECT_DEATH(gqa_attention_varlen(gpu(), q16, k, k, s.table_d, s.cu_d, s.past_d, 1.0f, out),
               "gqa_attention_varlen");
  const Tensor lat = dev(randn({s.num_pages, 16, 20})), rope = dev(randn({s.num_pages, 16, 6}));
  const Tensor kv_b64 = Tensor::empty({3 * 22, 20}, DType::kI64, Device::kCuda);
  const Tensor qm = dev(randn({2, 3, 18})), om = dev(randn({2, 3, 10}));
  EXPECT_DEATH(mla_attention_varlen(gpu(), qm, lat, rope, s.table_d, s.cu_d, s.past_d, kv_b64,
                                    {3, 12, 6, 10, 20}, 1.0f, om),
               "mla_attention_varlen");
  cuda::AttentionTuning force_tc;
  force_tc.mla_path = 2;
  const Tensor kv_b = dev(randn({3 * 22, 20}));
  EXPECT_DEATH(cuda::mla_attention_varlen_tuned(gpu(), qm, lat, rope, s.table_d, s.cu_d, s.past_d,
                                                kv_b, {3, 12, 6, 10, 20}, 1.0f, om, force_tc),
               "mla_attention_varlen: the tensor-core path");
}

}  // namespace
}  // namespace loom
