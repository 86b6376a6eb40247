// The CUDA varlen KDA / Gated DeltaNet op (kda_varlen_forward on the GPU: chunked form on tensor
// cores, token recurrence for short sequences and batch-invariant numerics, batched decode for
// one-token steps) and kda_chunked_forward, against the CPU twin on fresh random inputs.
//
// Every case draws new inputs (seed printed; LOOM_GPU_TEST_SEED replays), mixes sequence lengths
// around the chunk (64) and sub-chunk (16) boundaries and the recurrent threshold (8), shuffles
// the state slots in a pool with non-zero initial states, poisons the GPU output with NaN, and
// checks outputs, the final state of every named slot and that every other slot is bit-identical.
// bf16 cases round q, k, v (and beta where bf16) to bf16 once; the CPU twin gets those rounded
// values in f32, so the difference is the GPU's own arithmetic (bf16 operands, f32 accumulation).
//
// Errors, one GPUCHECK line each (tests/gpu/run.sh prints the table):
//  - <case>_out_rel_l2 / _state_rel_l2: the largest per-sequence (per-slot) ||gpu - cpu|| /
//    ||cpu||; bound 1e-4 for f32 and 1e-2 for bf16 (the bounds; METHOD.md: f32 arithmetic
//    lands far under 1e-3, bf16 operands between 1e-3 and 1e-2);
//  - <case>_out_max: max |gpu - cpu| / max(1, max |cpu|) over the whole output; bound 1e-4
//    (f32) and 4e-2 (bf16), which catches a single wrong row that a sequence's L2 norm could hide;
//  - <case>_untouched_slots: 0 when every slot not named is bit-identical (bound 0).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/activation.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/kda_chunked.h"
#include "kernels/cuda/kda_chunked_launch.h"
#include "kernels/elementwise.h"
#include "kernels/kda.h"
#include "kernels/norm.h"
#include "tests/gpu/gpu_test_support.h"
#include "tests/gpu/twin_tolerances.h"

namespace loom {
namespace {

std::mt19937_64& rng() {
  static std::mt19937_64 r(gpu_test_seed() ^ 0x6b6461ULL);
  return r;
}

const Exec& gpu() {
  static const Exec ex = cuda::device_exec(0);
  return ex;
}

void report(const std::string& name, double err, double tol) {
  const bool pass = err <= tol;  // false for NaN
  std::printf("GPUCHECK %s %.3e %.3e %s\n", name.c_str(), err, tol, pass ? "PASS" : "FAIL");
  std::fflush(stdout);
  EXPECT_LE(err, tol) << name;
}

// Rounds an f32 host tensor to bf16 in place (values) and returns the bf16 tensor.
Tensor round_bf16(Tensor& t) {
  Tensor b = Tensor::empty(t.shape(), DType::kBF16);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const uint16_t h = f32_to_bf16(t.data<float>()[i]);
    b.data<uint16_t>()[i] = h;
    t.data<float>()[i] = bf16_to_f32(h);
  }
  return b;
}

// A device tensor of `dtype` full of NaN.
Tensor poisoned(Shape shape, DType dtype) {
  Tensor h = Tensor::empty(shape, dtype);
  for (int64_t i = 0; i < h.numel(); ++i) {
    if (dtype == DType::kBF16) {
      h.data<uint16_t>()[i] = 0x7fc0;
    } else {
      h.data<float>()[i] = std::nanf("");
    }
  }
  return cuda::to_device(h);
}

Tensor host_f32(const Tensor& d) { return cuda::to_host(d).to_f32(); }

struct Case {
  std::string name;
  std::vector<int64_t> lens;
  int64_t Hk = 2, Hv = 4, dk = 128, dv = 128;
  bool scalar_g = false;
  float lower_bound = -5.0f;        // 0: softplus gate
  float a_lo = -2.0f, a_hi = 0.5f;  // A_log range
  bool bf16 = false, beta_bf16 = false;
  bool batch_invariant = false;
  int64_t max_seqlen = 0;
  int bv = 0;
};

struct Inputs {
  Tensor q, k, v, g, beta;    // f32 (bf16-rounded values for bf16 cases)
  Tensor qd, kd, vd, gd, bd;  // device, in the case's dtypes
  Tensor pool0;               // initial pool (host)
  Tensor slots, cu;           // host
  int64_t N = 0, B = 0, num_slots = 0;
  float scale = 1.0f;
  int fallback_subchunks = 0;  // 16-token sub-chunks whose decay span exceeds 80 nats
};

Inputs make_inputs(const Case& c) {
  std::mt19937_64& r = rng();
  Inputs in;
  in.B = static_cast<int64_t>(c.lens.size());
  in.N = std::accumulate(c.lens.begin(), c.lens.end(), int64_t{0});
  const int64_t gw = c.scalar_g ? 1 : c.dk;
  in.q = twin::randn(r, {in.N, c.Hk, c.dk});
  in.k = twin::randn(r, {in.N, c.Hk, c.dk});
  l2norm_forward(host_exec(), in.q, 1e-6f, 1.0f, in.q);
  l2norm_forward(host_exec(), in.k, 1e-6f, 1.0f, in.k);
  in.v = twin::randn(r, {in.N, c.Hv, c.dv});
  const Tensor f = twin::randn(r, {in.N, c.Hv * gw}, 2.0f);
  const Tensor A_log = twin::uniform(r, {c.Hv}, c.a_lo, c.a_hi);
  Tensor g2 = Tensor::empty(f.shape());
  kda_gate_forward(host_exec(), f, A_log, Tensor(), c.lower_bound, g2);
  in.g = g2.reshape({in.N, c.Hv, gw});
  in.beta = twin::randn(r, {in.N, c.Hv});
  sigmoid_inplace(host_exec(), in.beta);
  in.scale = 1.0f / std::sqrt(static_cast<float>(c.dk));
  if (c.bf16) {
    in.qd = cuda::to_device(round_bf16(in.q));
    in.kd = cuda::to_device(round_bf16(in.k));
    in.vd = cuda::to_device(round_bf16(in.v));
  } else {
    in.qd = cuda::to_device(in.q);
    in.kd = cuda::to_device(in.k);
    in.vd = cuda::to_device(in.v);
  }
  in.bd = c.beta_bf16 ? cuda::to_device(round_bf16(in.beta)) : cuda::to_device(in.beta);
  in.gd = cuda::to_device(in.g);
  in.num_slots = 2 * in.B + 3;
  in.pool0 = twin::randn(r, {in.num_slots, c.Hv, c.dk, c.dv}, 0.1f);
  std::vector<int32_t> perm(static_cast<size_t>(in.num_slots));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), r);
  in.slots = Tensor::empty({in.B}, DType::kI32);
  std::copy(perm.begin(), perm.begin() + in.B, in.slots.data<int32_t>());
  in.cu = Tensor::empty({in.B + 1}, DType::kI64);
  int64_t* cu = in.cu.data<int64_t>();
  cu[0] = 0;
  for (int64_t b = 0; b < in.B; ++b) cu[b + 1] = cu[b] + c.lens[static_cast<size_t>(b)];
  // Sub-chunks whose diagonal block takes the element-wise path (coverage, printed).
  const float* gp = in.g.data<float>();
  for (int64_t b = 0; b < in.B; ++b) {
    for (int64_t s0 = cu[b]; s0 < cu[b + 1]; s0 += 16) {
      const int64_t s1 = std::min(cu[b + 1], s0 + 16);
      for (int64_t h = 0; h < c.Hv; ++h) {
        bool over = false;
        for (int64_t ch = 0; ch < gw && !over; ++ch) {
          double span = 0.0;
          for (int64_t t = s0 + 1; t < s1; ++t) span -= gp[(t * c.Hv + h) * gw + ch];
          over = span > 80.0;
        }
        in.fallback_subchunks += over ? 1 : 0;
      }
    }
  }
  return in;
}

// ||a - b|| / ||b|| over elements [begin, end) of two f32 host tensors (inf on NaN).
double rel_l2(const float* a, const float* b, int64_t begin, int64_t end) {
  double num = 0.0, den = 0.0;
  for (int64_t i = begin; i < end; ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return den == 0.0 ? std::sqrt(num) : std::sqrt(num / den);
}

void run_case(const Case& c) {
  const Inputs in = make_inputs(c);
  // CPU twin.
  Exec host = host_exec();
  host.batch_invariant = c.batch_invariant;
  Tensor pool_ref = in.pool0.clone();
  Tensor out_ref = Tensor::empty({in.N, c.Hv, c.dv});
  kda_varlen_forward(host, in.q, in.k, in.v, in.g, in.beta, in.scale, pool_ref, in.slots, in.cu,
                     out_ref, c.max_seqlen);
  // GPU.
  Exec ex = gpu();
  ex.batch_invariant = c.batch_invariant;
  const DType act = c.bf16 ? DType::kBF16 : DType::kF32;
  Tensor pool_d = cuda::to_device(in.pool0);
  Tensor out_d = poisoned({in.N, c.Hv, c.dv}, act);
  const Tensor slots_d = cuda::to_device(in.slots), cu_d = cuda::to_device(in.cu);
  cuda::kda_varlen_forward_tuned(ex, in.qd, in.kd, in.vd, in.gd, in.bd, in.scale, pool_d, slots_d,
                                 cu_d, out_d, c.max_seqlen, c.bv);
  const Tensor out = host_f32(out_d), pool = cuda::to_host(pool_d);

  const double tol_l2 = c.bf16 ? 1e-2 : 1e-4, tol_max = c.bf16 ? 4e-2 : 1e-4;
  const int64_t* cu = in.cu.data<int64_t>();
  const int64_t row = c.Hv * c.dv, slot_elems = c.Hv * c.dk * c.dv;
  double out_l2 = 0.0, state_l2 = 0.0;
  for (int64_t b = 0; b < in.B; ++b) {
    if (cu[b + 1] > cu[b])
      out_l2 = std::max(
          out_l2, rel_l2(out.data<float>(), out_ref.data<float>(), cu[b] * row, cu[b + 1] * row));
    const int64_t s = in.slots.data<int32_t>()[b];
    state_l2 = std::max(state_l2, rel_l2(pool.data<float>(), pool_ref.data<float>(), s * slot_elems,
                                         (s + 1) * slot_elems));
  }
  // Slots not named must be bit-identical to the upload.
  std::vector<bool> named(static_cast<size_t>(in.num_slots), false);
  for (int64_t b = 0; b < in.B; ++b) named[static_cast<size_t>(in.slots.data<int32_t>()[b])] = true;
  int64_t changed = 0;
  for (int64_t s = 0; s < in.num_slots; ++s) {
    if (named[static_cast<size_t>(s)]) continue;
    changed +=
        std::memcmp(pool.data<float>() + s * slot_elems, in.pool0.data<float>() + s * slot_elems,
                    slot_elems * sizeof(float)) != 0;
  }
  std::printf("CASE %s: N %lld, B %lld, %d fallback sub-chunk heads\n", c.name.c_str(),
              static_cast<long long>(in.N), static_cast<long long>(in.B), in.fallback_subchunks);
  report(c.name + "_out_rel_l2", out_l2, tol_l2);
  report(c.name + "_out_max", twin::scaled_err(out, out_ref), tol_max);
  report(c.name + "_state_rel_l2", state_l2, tol_l2);
  report(c.name + "_untouched_slots", static_cast<double>(changed), 0.0);
}

const std::vector<int64_t> kMix = {130, 1, 65, 7, 1000, 64, 9, 8, 200, 63};

class KdaChunkedCuda : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cuda::init();
    (void)gpu_test_seed();
  }
};

// The warp-level bf16 GEMM (fragment loaders and mma.sync) on its own: C = A B and A^T B against
// a double reference; bf16 products are exact in f32, so only the f32 accumulation rounds (bound
// 64 terms of u relative to sum |a b|).
TEST_F(KdaChunkedCuda, WarpMma) {
  Tensor A = twin::randn(rng(), {64, 64}), B = twin::randn(rng(), {64, 32});
  const Tensor Ab = round_bf16(A), Bb = round_bf16(B);
  const Tensor Ad = cuda::to_device(Ab), Bd = cuda::to_device(Bb);
  Tensor C = poisoned({64, 32}, DType::kF32), Ct = poisoned({64, 32}, DType::kF32);
  cuda::launch::kda_mma_selftest(cuda::stream_of(gpu()), Ad.data<uint16_t>(), Bd.data<uint16_t>(),
                                 C.data<float>(), Ct.data<float>());
  const Tensor Ch = cuda::to_host(C), Cth = cuda::to_host(Ct);
  double err = 0.0, errt = 0.0;
  for (int i = 0; i < 64; ++i) {
    for (int j = 0; j < 32; ++j) {
      double ref = 0.0, mag = 0.0, reft = 0.0, magt = 0.0;
      for (int k = 0; k < 64; ++k) {
        ref += double{A.data<float>()[i * 64 + k]} * B.data<float>()[k * 32 + j];
        mag += std::fabs(double{A.data<float>()[i * 64 + k]} * B.data<float>()[k * 32 + j]);
        reft += double{A.data<float>()[k * 64 + i]} * B.data<float>()[k * 32 + j];
        magt += std::fabs(double{A.data<float>()[k * 64 + i]} * B.data<float>()[k * 32 + j]);
      }
      if (j < 8) reft = 0.0, magt = 1.0;  // the transposed product fills columns 8..31
      const double g = Ch.data<float>()[i * 32 + j], gt = Cth.data<float>()[i * 32 + j];
      err = std::isfinite(g) ? std::max(err, std::fabs(g - ref) / mag) : INFINITY;
      errt = std::isfinite(gt) ? std::max(errt, std::fabs(gt - reft) / magt) : INFINITY;
    }
  }
  report("kda_warp_mma_AB", err, 64 * twin::kEps);
  report("kda_warp_mma_AtB", errt, 64 * twin::kEps);
}

TEST_F(KdaChunkedCuda, VarlenMixF32) {
  Case c{.name = "kda_varlen_mix_f32", .lens = kMix};
  run_case(c);
}

TEST_F(KdaChunkedCuda, VarlenMixBf16) {
  Case c{.name = "kda_varlen_mix_bf16", .lens = kMix, .bf16 = true, .beta_bf16 = true};
  run_case(c);
  c.name = "kda_varlen_mix_bf16_bv64";
  c.bv = 64;
  c.beta_bf16 = false;
  run_case(c);
}

TEST_F(KdaChunkedCuda, SoftplusGatesFallback) {
  // Strong decays: most 16-token sub-chunks decay by more than 80 nats in some channel, so their
  // diagonal blocks take the element-wise path.
  for (bool bf : {false, true}) {
    Case c{.name = std::string("kda_varlen_softplus_strong_") + (bf ? "bf16" : "f32"),
           .lens = {300, 17, 129},
           .lower_bound = 0.0f,
           .a_lo = 1.0f,
           .a_hi = 2.0f,
           .bf16 = bf,
           .beta_bf16 = bf};
    run_case(c);
    c.name = std::string("kda_varlen_softplus_") + (bf ? "bf16" : "f32");
    c.a_lo = -2.0f;
    c.a_hi = 0.5f;
    c.lens = {257, 40, 96};
    run_case(c);
  }
}

TEST_F(KdaChunkedCuda, GatedDeltaNet) {
  // Scalar decay per head, Hv = 2 Hk (Qwen3-Next's shape family).
  for (bool bf : {false, true}) {
    Case c{.name = std::string("gdn_varlen_mix_") + (bf ? "bf16" : "f32"),
           .lens = kMix,
           .Hk = 2,
           .Hv = 4,
           .scalar_g = true,
           .lower_bound = 0.0f,
           .bf16 = bf,
           .beta_bf16 = bf};
    run_case(c);
  }
}

TEST_F(KdaChunkedCuda, SmallHeads) {
  // The fixtures' head sizes (24, 32) and a value width not a multiple of the 32-column tile.
  for (bool bf : {false, true}) {
    run_case({.name = std::string("kda_varlen_dk32_dv32_") + (bf ? "bf16" : "f32"),
              .lens = {70, 5, 200, 33},
              .Hk = 3,
              .Hv = 3,
              .dk = 32,
              .dv = 32,
              .bf16 = bf});
    run_case({.name = std::string("kda_varlen_dk24_dv40_") + (bf ? "bf16" : "f32"),
              .lens = {70, 5, 200, 33},
              .Hk = 1,
              .Hv = 2,
              .dk = 24,
              .dv = 40,
              .bf16 = bf});
    run_case({.name = std::string("kda_varlen_dk64_dv64_") + (bf ? "bf16" : "f32"),
              .lens = {70, 5, 200, 33},
              .Hk = 2,
              .Hv = 2,
              .dk = 64,
              .dv = 64,
              .bf16 = bf});
  }
  // Not a multiple of 8: every sequence takes the recurrence.
  run_case({.name = "kda_varlen_dk36_dv20_recurrent_f32",
            .lens = {70, 5, 130},
            .Hk = 1,
            .Hv = 2,
            .dk = 36,
            .dv = 20});
}

TEST_F(KdaChunkedCuda, LongSequence) {
  for (bool bf : {false, true}) {
    run_case({.name = std::string("kda_T4099_Hv2_") + (bf ? "bf16" : "f32"),
              .lens = {4099},
              .Hk = 2,
              .Hv = 2,
              .bf16 = bf,
              .beta_bf16 = bf});
  }
}

TEST_F(KdaChunkedCuda, BatchInvariantAndDecode) {
  for (bool bf : {false, true}) {
    const std::string t = bf ? "bf16" : "f32";
    run_case({.name = "kda_varlen_batch_invariant_" + t,
              .lens = {130, 1, 65, 7},
              .bf16 = bf,
              .beta_bf16 = bf,
              .batch_invariant = true});
    // One row per sequence with max_seqlen 1: the batched decode kernel.
    run_case({.name = "kda_varlen_decode_B37_" + t,
              .lens = std::vector<int64_t>(37, 1),
              .Hk = 4,
              .Hv = 8,
              .bf16 = bf,
              .beta_bf16 = bf,
              .max_seqlen = 1});
    // Short sequences only, with the hint: recurrent launch alone.
    run_case({.name = "kda_varlen_short_" + t, .lens = {3, 8, 1, 5}, .bf16 = bf, .max_seqlen = 8});
  }
}

// kda_chunked_forward (one sequence, always chunked) against the CPU chunked form.
TEST_F(KdaChunkedCuda, ChunkedForward) {
  for (bool bf : {false, true}) {
    for (int64_t T : {5, 333}) {
      Case c{.lens = {T}, .bf16 = bf};
      Inputs in = make_inputs(c);
      Tensor s_ref = in.pool0.select(0).clone();
      Tensor o_ref = Tensor::empty({T, c.Hv, c.dv});
      kda_chunked_forward(host_exec(), in.q, in.k, in.v, in.g, in.beta, in.scale, s_ref, o_ref);
      Tensor sd = cuda::to_device(in.pool0.select(0).clone());
      Tensor od = poisoned({T, c.Hv, c.dv}, bf ? DType::kBF16 : DType::kF32);
      kda_chunked_forward(gpu(), in.qd, in.kd, in.vd, in.gd, in.bd, in.scale, sd, od);
      const Tensor o = host_f32(od), s = cuda::to_host(sd);
      const std::string name =
          "kda_chunked_forward_T" + std::to_string(T) + (bf ? "_bf16" : "_f32");
      const double tol = bf ? 1e-2 : 1e-4;
      report(name + "_out_rel_l2", rel_l2(o.data<float>(), o_ref.data<float>(), 0, o.numel()), tol);
      report(name + "_state_rel_l2", rel_l2(s.data<float>(), s_ref.data<float>(), 0, s.numel()),
             tol);
    }
  }
}

}  // namespace
}  // namespace loom
