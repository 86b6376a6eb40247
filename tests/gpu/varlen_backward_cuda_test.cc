// The trainer's packed-batch backward kernels on CUDA, one launch for every sequence
// (kda_varlen_backward, causal_conv1d_varlen_backward, causal_attention_varlen_forward and
// _backward), against the CPU, which runs each sequence as a call of its own, on fresh random
// inputs (the seed is printed; LOOM_GPU_TEST_SEED replays one). The batches mix lengths that are
// not multiples of any tile (77, 130, 65, 9, 200), single rows, sequences shorter than the
// convolution's width, and empty sequences; and each GPU launch against the GPU's own
// single-sequence calls, which it must match bit for bit (a block does exactly one sequence's
// work), so no sequence reads another's rows.
//
// Bound: 1e-4 relative L2 per tensor (issue 14's f32 bound for the trainer's gradients); the
// twins differ only in summation order (a few 1e-7), a row that leaks into another sequence is
// O(1).
// Each check prints "GPUCHECK <name> <error> <bound> <PASS|FAIL>" for tests/gpu/run.sh.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention_backward.h"
#include "kernels/conv.h"
#include "kernels/cuda/device.h"
#include "kernels/kda_backward.h"
#include "tests/gpu/gpu_test_support.h"
#include "tests/gpu/twin_tolerances.h"

namespace loom {
namespace {

constexpr double kTol = 1e-4;

std::mt19937_64& rng() {
  static std::mt19937_64 r(gpu_test_seed());
  return r;
}

Tensor dev(const Tensor& h) { return cuda::to_device(h); }
Tensor host(const Tensor& d) { return cuda::to_host(d); }
Tensor poisoned(Shape shape) { return dev(Tensor::full(shape, std::nanf(""))); }

const Exec& gpu() {
  static const Exec ex = cuda::device_exec(0);
  return ex;
}

// sqrt(sum (got - ref)^2 / sum ref^2) in f64 (inf on NaN).
double rel_l2(const Tensor& got, const Tensor& ref) {
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double g = got.data<float>()[i], r = ref.data<float>()[i];
    if (!std::isfinite(g)) return INFINITY;
    num += (g - r) * (g - r);
    den += r * r;
  }
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}

void report(const std::string& name, double err) {
  const bool pass = err <= kTol;  // false for NaN
  std::printf("GPUCHECK %s %.3e %.3e %s\n", name.c_str(), err, kTol, pass ? "PASS" : "FAIL");
  std::fflush(stdout);
  EXPECT_LE(err, kTol) << name;
}

void expect_same_bits(const std::string& name, const Tensor& a, const Tensor& b) {
  ASSERT_EQ(a.nbytes(), b.nbytes()) << name;
  const bool same = std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
  std::printf("GPUCHECK %s_bits %d 0 %s\n", name.c_str(), same ? 0 : 1, same ? "PASS" : "FAIL");
  EXPECT_TRUE(same) << name << ": the packed launch differs from one call per sequence";
}

struct Packed {
  std::vector<int64_t> cu;  // row offsets, 0 first
  int64_t longest = 0;
  int64_t rows() const { return cu.back(); }
  Tensor offsets() const {
    Tensor t = Tensor::empty({static_cast<int64_t>(cu.size())}, DType::kI64);
    std::memcpy(t.raw(), cu.data(), t.nbytes());
    return t;
  }
};

Packed pack(const std::vector<int64_t>& lengths) {
  Packed p;
  p.cu.push_back(0);
  for (int64_t n : lengths) {
    p.cu.push_back(p.cu.back() + n);
    p.longest = std::max(p.longest, n);
  }
  return p;
}

const std::vector<int64_t> kLengths = {77, 1, 0, 130, 65, 9, 200, 2};

// ---- delta rule ---------------------------------------------------------------------------

struct KdaGrads {
  Tensor dq, dk, dv, dg, dbeta;
};

KdaGrads kda_grads_like(const twin::KdaInputs& in, bool on_gpu) {
  auto make = [&](Shape s) { return on_gpu ? poisoned(s) : Tensor::empty(s); };
  return {make(in.q.shape()), make(in.k.shape()), make(in.v.shape()), make(in.g.shape()),
          make(in.beta.shape())};
}

KdaGrads to_host(const KdaGrads& d) {
  return {host(d.dq), host(d.dk), host(d.dv), host(d.dg), host(d.dbeta)};
}

TEST(VarlenBackwardCuda, DeltaRuleMatchesTheCpu) {
  const twin::KdaCase cases[] = {
      {0, 2, 4, 32, 24, false, false},  // KDA, value heads sharing key heads, dk != dv
      {0, 1, 1, 40, 72, true, true},    // GDN (per-head decay), softplus gate
      {0, 4, 4, 64, 64, false, false},  // the bundled default's shape
  };
  const Packed p = pack(kLengths);
  for (twin::KdaCase c : cases) {
    c.T = p.rows();
    const twin::KdaInputs in = twin::kda_inputs(rng(), c);
    const Tensor d_out = twin::randn(rng(), {c.T, c.Hv, c.dv});
    const Tensor cu = p.offsets();
    KdaGrads ref = kda_grads_like(in, false);
    kda_varlen_backward(host_exec(), in.q, in.k, in.v, in.g, in.beta, in.scale, cu, p.longest,
                        d_out, ref.dq, ref.dk, ref.dv, ref.dg, ref.dbeta);
    const Tensor q = dev(in.q), k = dev(in.k), v = dev(in.v), g = dev(in.g), beta = dev(in.beta),
                 dout = dev(d_out), dcu = dev(cu);
    KdaGrads d = kda_grads_like(in, true);
    kda_varlen_backward(gpu(), q, k, v, g, beta, in.scale, dcu, p.longest, dout, d.dq, d.dk, d.dv,
                        d.dg, d.dbeta);
    const KdaGrads got = to_host(d);
    char tag[96];
    std::snprintf(tag, sizeof(tag), "kda_varlen_backward_%lldx%lld_%lldx%lld_%s",
                  static_cast<long long>(c.Hk), static_cast<long long>(c.Hv),
                  static_cast<long long>(c.dk), static_cast<long long>(c.dv),
                  c.scalar_g ? "gdn" : "kda");
    report(std::string(tag) + "_dq", rel_l2(got.dq, ref.dq));
    report(std::string(tag) + "_dk", rel_l2(got.dk, ref.dk));
    report(std::string(tag) + "_dv", rel_l2(got.dv, ref.dv));
    report(std::string(tag) + "_dg", rel_l2(got.dg, ref.dg));
    report(std::string(tag) + "_dbeta", rel_l2(got.dbeta, ref.dbeta));

    // The same bits as one chunked call per sequence on the GPU, from a zero state.
    KdaGrads one = kda_grads_like(in, true);
    const Tensor zero = dev(Tensor::zeros({c.Hv, c.dk, c.dv}));
    for (size_t s = 0; s + 1 < p.cu.size(); ++s) {
      const int64_t b = p.cu[s], e = p.cu[s + 1];
      if (b == e) continue;
      kda_chunked_backward(gpu(), q.slice(0, b, e), k.slice(0, b, e), v.slice(0, b, e),
                           g.slice(0, b, e), beta.slice(0, b, e), in.scale, zero,
                           dout.slice(0, b, e), Tensor(), one.dq.slice(0, b, e),
                           one.dk.slice(0, b, e), one.dv.slice(0, b, e), one.dg.slice(0, b, e),
                           one.dbeta.slice(0, b, e), Tensor());
    }
    const KdaGrads each = to_host(one);
    expect_same_bits(std::string(tag) + "_dq", got.dq, each.dq);
    expect_same_bits(std::string(tag) + "_dk", got.dk, each.dk);
    expect_same_bits(std::string(tag) + "_dv", got.dv, each.dv);
    expect_same_bits(std::string(tag) + "_dg", got.dg, each.dg);
    expect_same_bits(std::string(tag) + "_dbeta", got.dbeta, each.dbeta);
  }
}

// Batch-invariant numerics keep the recurrence for every sequence, one call each, on both devices.
TEST(VarlenBackwardCuda, DeltaRuleBatchInvariantTakesTheRecurrence) {
  const Packed p = pack({33, 0, 5, 70});
  twin::KdaCase c{p.rows(), 1, 2, 16, 24, false, false};
  const twin::KdaInputs in = twin::kda_inputs(rng(), c);
  const Tensor d_out = twin::randn(rng(), {c.T, c.Hv, c.dv});
  const Tensor cu = p.offsets();
  Exec cpu = host_exec(), cuda_ex = gpu();
  cpu.batch_invariant = cuda_ex.batch_invariant = true;
  KdaGrads ref = kda_grads_like(in, false);
  kda_varlen_backward(cpu, in.q, in.k, in.v, in.g, in.beta, in.scale, cu, p.longest, d_out, ref.dq,
                      ref.dk, ref.dv, ref.dg, ref.dbeta);
  KdaGrads d = kda_grads_like(in, true);
  kda_varlen_backward(cuda_ex, dev(in.q), dev(in.k), dev(in.v), dev(in.g), dev(in.beta), in.scale,
                      dev(cu), p.longest, dev(d_out), d.dq, d.dk, d.dv, d.dg, d.dbeta);
  const KdaGrads got = to_host(d);
  report("kda_varlen_backward_batch_invariant_dq", rel_l2(got.dq, ref.dq));
  report("kda_varlen_backward_batch_invariant_dk", rel_l2(got.dk, ref.dk));
  report("kda_varlen_backward_batch_invariant_dv", rel_l2(got.dv, ref.dv));
  report("kda_varlen_backward_batch_invariant_dg", rel_l2(got.dg, ref.dg));
  report("kda_varlen_backward_batch_invariant_dbeta", rel_l2(got.dbeta, ref.dbeta));
}

// ---- short convolution --------------------------------------------------------------------

TEST(VarlenBackwardCuda, ConvMatchesTheCpu) {
  // Sequences of 1, 2 and 3 rows are shorter than the width: their first taps read zeros, never
  // the previous sequence's rows.
  const Packed p = pack({77, 1, 0, 2, 130, 3, 65});
  for (const bool silu : {true, false}) {
    const int64_t T = p.rows(), C = 97, W = 4;
    const Tensor x = twin::randn(rng(), {T, C}), w = twin::randn(rng(), {C, W}, 0.5f);
    const Tensor dout = twin::randn(rng(), {T, C}), dw0 = twin::randn(rng(), {C, W});
    const Tensor cu = p.offsets();
    Tensor dx_ref = Tensor::empty({T, C}), dw_ref = Tensor::empty({C, W});
    std::memcpy(dw_ref.raw(), dw0.raw(), dw0.nbytes());
    causal_conv1d_varlen_backward(host_exec(), x, w, cu, silu, dout, dx_ref, dw_ref);
    const Tensor dx = poisoned({T, C}), dw = dev(dw0);
    const Tensor gx = dev(x), gw = dev(w), gdout = dev(dout);
    causal_conv1d_varlen_backward(gpu(), gx, gw, dev(cu), silu, gdout, dx, dw);
    const std::string tag = std::string("causal_conv1d_varlen_backward") + (silu ? "_silu" : "");
    const Tensor got_dx = host(dx);
    report(tag + "_dx", rel_l2(got_dx, dx_ref));
    report(tag + "_dweight", rel_l2(host(dw), dw_ref));
    // dx: the bits of one call per sequence (dweight's partial sums cross sequences: not bits).
    const Tensor dx_each = poisoned({T, C}), dw_each = dev(Tensor::zeros({C, W}));
    for (size_t s = 0; s + 1 < p.cu.size(); ++s) {
      const int64_t b = p.cu[s], e = p.cu[s + 1];
      if (b == e) continue;
      causal_conv1d_backward(gpu(), gx.slice(0, b, e), gw, Tensor(), silu, gdout.slice(0, b, e),
                             Tensor(), dx_each.slice(0, b, e), dw_each, Tensor());
    }
    expect_same_bits(tag + "_dx", got_dx, host(dx_each));
  }
}

// ---- causal attention ---------------------------------------------------------------------

TEST(VarlenBackwardCuda, AttentionMatchesTheCpu) {
  const Packed p = pack(kLengths);
  const int64_t T = p.rows(), Hq = 4, Hkv = 2, d = 40, dv = 24;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const Tensor q = twin::randn(rng(), {T, Hq, d}), k = twin::randn(rng(), {T, Hkv, d});
  const Tensor v = twin::randn(rng(), {T, Hkv, dv}), d_out = twin::randn(rng(), {T, Hq, dv});
  const Tensor cu = p.offsets();
  Tensor out = Tensor::empty({T, Hq, dv}), lse = Tensor::empty({T, Hq});
  causal_attention_varlen_forward(host_exec(), q, k, v, cu, p.longest, scale, out, lse);
  Tensor dq = Tensor::empty(q.shape()), dk = Tensor::empty(k.shape()),
         dvv = Tensor::empty(v.shape());
  causal_attention_varlen_backward(host_exec(), q, k, v, cu, p.longest, out, lse, d_out, scale, dq,
                                   dk, dvv);

  const Tensor gq = dev(q), gk = dev(k), gv = dev(v), gdo = dev(d_out), gcu = dev(cu);
  const Tensor g_out = poisoned(out.shape()), g_lse = poisoned(lse.shape());
  causal_attention_varlen_forward(gpu(), gq, gk, gv, gcu, p.longest, scale, g_out, g_lse);
  const Tensor g_dq = poisoned(q.shape()), g_dk = poisoned(k.shape()), g_dv = poisoned(v.shape());
  causal_attention_varlen_backward(gpu(), gq, gk, gv, gcu, p.longest, g_out, g_lse, gdo, scale,
                                   g_dq, g_dk, g_dv);
  const Tensor h_out = host(g_out), h_lse = host(g_lse), h_dq = host(g_dq), h_dk = host(g_dk),
               h_dv = host(g_dv);
  report("causal_attention_varlen_forward_out", rel_l2(h_out, out));
  report("causal_attention_varlen_forward_lse", rel_l2(h_lse, lse));
  report("causal_attention_varlen_backward_dq", rel_l2(h_dq, dq));
  report("causal_attention_varlen_backward_dk", rel_l2(h_dk, dk));
  report("causal_attention_varlen_backward_dv", rel_l2(h_dv, dvv));

  // The bits of one call per sequence on the GPU.
  const Tensor e_out = poisoned(out.shape()), e_lse = poisoned(lse.shape());
  const Tensor e_dq = poisoned(q.shape()), e_dk = poisoned(k.shape()), e_dv = poisoned(v.shape());
  for (size_t s = 0; s + 1 < p.cu.size(); ++s) {
    const int64_t b = p.cu[s], e = p.cu[s + 1];
    if (b == e) continue;
    causal_attention_forward(gpu(), gq.slice(0, b, e), gk.slice(0, b, e), gv.slice(0, b, e), scale,
                             e_out.slice(0, b, e), e_lse.slice(0, b, e));
    causal_attention_backward(gpu(), gq.slice(0, b, e), gk.slice(0, b, e), gv.slice(0, b, e),
                              e_out.slice(0, b, e), e_lse.slice(0, b, e), gdo.slice(0, b, e), scale,
                              e_dq.slice(0, b, e), e_dk.slice(0, b, e), e_dv.slice(0, b, e));
  }
  expect_same_bits("causal_attention_varlen_forward_out", h_out, host(e_out));
  expect_same_bits("causal_attention_varlen_forward_lse", h_lse, host(e_lse));
  expect_same_bits("causal_attention_varlen_backward_dq", h_dq, host(e_dq));
  expect_same_bits("causal_attention_varlen_backward_dk", h_dk, host(e_dk));
  expect_same_bits("causal_attention_varlen_backward_dv", h_dv, host(e_dv));
}

}  // namespace
}  // namespace loom
