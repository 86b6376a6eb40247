// CUDA kernels against their CPU twins. Every test draws fresh random inputs (the seed is printed;
// set LOOM_GPU_TEST_SEED to replay one), uses sizes that are not multiples of 32 or 128, poisons
// GPU outputs with NaN before the kernel runs (so unwritten elements fail), and calls the public
// dispatch functions (kernels/*.h) with host tensors (CPU twin) and device tensors (CUDA).
//
// Each check prints a line "GPUCHECK <name> <max error> <tolerance> <PASS|FAIL>" that
// tests/gpu/run.sh turns into the results table. Unless a test says otherwise the error is the
// scaled error max_i |gpu_i - cpu_i| / max(1, max_i |cpu_i|); eps below is FLT_EPSILON (2^-23).
// The norm, GEMM and KDA bounds and their error models are in tests/gpu/twin_tolerances.h, where
// tests/gpu/cuda_tolerances_test.cc (every build, no GPU) checks that broken results exceed them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/activation.h"
#include "kernels/conv.h"
#include "kernels/cpu/kda.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/kda_decode.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/kda.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "tests/gpu/gpu_test_support.h"
#include "tests/gpu/model_test_support.h"
#include "tests/gpu/twin_tolerances.h"

namespace loom {
namespace {

std::mt19937_64& rng() {
  static std::mt19937_64 r(gpu_test_seed());
  return r;
}

Tensor randn(Shape shape, float scale = 1.0f, float mean = 0.0f) {
  return twin::randn(rng(), shape, scale, mean);
}
Tensor uniform(Shape shape, float lo, float hi) { return twin::uniform(rng(), shape, lo, hi); }

Tensor dev(const Tensor& h) { return cuda::to_device(h); }
// An i64 host tensor (positions, row ids) from a vector.
Tensor i64_tensor(const std::vector<int64_t>& values) {
  Tensor t = Tensor::empty({static_cast<int64_t>(values.size())}, DType::kI64);
  std::copy(values.begin(), values.end(), t.data<int64_t>());
  return t;
}
// CUDA device 0 on its context's stream.
const Exec& gpu() {
  static const Exec ex = cuda::device_exec(0);
  return ex;
}
Tensor host(const Tensor& d) { return cuda::to_host(d); }
// A device tensor full of NaN: any element the kernel fails to write fails the comparison.
Tensor poisoned(Shape shape) { return dev(Tensor::full(shape, std::nanf(""))); }

// twin::scaled_err of a device or host result.
double scaled_err(const Tensor& got_dev_or_host, const Tensor& ref) {
  return twin::scaled_err(
      got_dev_or_host.device() == Device::kCuda ? host(got_dev_or_host) : got_dev_or_host, ref);
}

void report(const std::string& name, double err, double tol) {
  const bool pass = err <= tol;  // false for NaN
  std::printf("GPUCHECK %s %.3e %.3e %s\n", name.c_str(), err, tol, pass ? "PASS" : "FAIL");
  std::fflush(stdout);
  EXPECT_LE(err, tol) << name;
}

class CudaKernels : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cuda::init();
    (void)gpu_test_seed();
  }
};

// ---------------------------------------------------------------------------------------------
// Norms: tolerance twin::norm_tol (tests/gpu/twin_tolerances.h says why).
// D = 40 and 128 take the warp-per-row kernel (at most 64 units a row), 129 and 4096 a block.
TEST_F(CudaKernels, RmsNorm) {
  for (int64_t D : {40, 128, 129, 4096}) {
    for (float offset : {0.0f, 1.0f}) {
      const int64_t N = 37;
      Tensor x = randn({N, D}, 2.0f), w = randn({D}, 0.5f);
      Tensor ref = Tensor::empty({N, D});
      rmsnorm_forward(host_exec(), x, w, 1e-6f, offset, ref);
      Tensor xd = dev(x), wd = dev(w), od = poisoned({N, D});
      rmsnorm_forward(gpu(), xd, wd, 1e-6f, offset, od);
      const double tol = twin::norm_tol(D);
      report("rmsnorm_D" + std::to_string(D) + "_off" + std::to_string(int(offset)),
             scaled_err(od, ref), tol);
      rmsnorm_forward(gpu(), xd, wd, 1e-6f, offset, xd);  // out aliases x
      report("rmsnorm_alias_D" + std::to_string(D), scaled_err(xd, ref), tol);
    }
  }
}

TEST_F(CudaKernels, L2Norm) {
  for (int64_t d : {129, 128}) {
    Tensor x = randn({61, 3, d}, 1.5f);
    Tensor ref = Tensor::empty(x.shape());
    l2norm_forward(host_exec(), x, 1e-6f, 0.7f, ref);
    Tensor xd = dev(x), od = poisoned(x.shape());
    l2norm_forward(gpu(), xd, 1e-6f, 0.7f, od);
    report("l2norm_d" + std::to_string(d), scaled_err(od, ref), twin::norm_tol(d));
  }
}

// ---------------------------------------------------------------------------------------------
// Elementwise. Additions and copies are exact (tolerance 0). sigmoid/silu use expf, within 2 ulp
// on the GPU and 1 ulp in glibc; with the divide and multiply that is < 8 eps relative.
TEST_F(CudaKernels, Elementwise) {
  const int64_t N = 37, C = 129;
  const Tensor a = randn({N, C}, 3.0f), b = randn({N, C}, 3.0f);
  const Tensor bias = randn({C}), grow = randn({N}, 2.0f);
  auto run = [&](const std::string& name, double tol, auto&& op_cpu, auto&& op_gpu) {
    Tensor x = a.clone();
    op_cpu(x);
    Tensor xd = dev(a);
    op_gpu(xd);
    report(name, scaled_err(xd, x), tol);
  };
  const Tensor bd = dev(b), biasd = dev(bias), growd = dev(grow);
  run(
      "add_inplace", 0.0, [&](const Tensor& x) { add_inplace(host_exec(), x, b); },
      [&](const Tensor& x) { add_inplace(gpu(), x, bd); });
  run(
      "add_bias", 0.0, [&](const Tensor& x) { add_bias(host_exec(), x, bias); },
      [&](const Tensor& x) { add_bias(gpu(), x, biasd); });
  run(
      "mul_sigmoid_inplace", 8 * twin::kEps,
      [&](const Tensor& x) { mul_sigmoid_inplace(host_exec(), x, b); },
      [&](const Tensor& x) { mul_sigmoid_inplace(gpu(), x, bd); });
  run(
      "mul_sigmoid_rows", 8 * twin::kEps,
      [&](const Tensor& x) { mul_sigmoid_rows(host_exec(), x, grow); },
      [&](const Tensor& x) { mul_sigmoid_rows(gpu(), x, growd); });
  run(
      "mul_silu_inplace", 8 * twin::kEps,
      [&](const Tensor& x) { mul_silu_inplace(host_exec(), x, b); },
      [&](const Tensor& x) { mul_silu_inplace(gpu(), x, bd); });
  run(
      "sigmoid_inplace", 8 * twin::kEps, [&](const Tensor& x) { sigmoid_inplace(host_exec(), x); },
      [&](const Tensor& x) { sigmoid_inplace(gpu(), x); });

  // Column copies and row gathers: exact.
  const int64_t c0 = 17, cw = 45;
  Tensor ref = Tensor::empty({N, cw});
  copy_columns(host_exec(), a, c0, ref);
  Tensor cd = poisoned({N, cw});
  copy_columns(gpu(), dev(a), c0, cd);
  report("copy_columns", scaled_err(cd, ref), 0.0);

  const Tensor small = randn({N, cw});
  Tensor sref = a.clone();
  scatter_columns(host_exec(), small, c0, sref);
  Tensor sd = dev(a);
  scatter_columns(gpu(), dev(small), c0, sd);
  report("scatter_columns", scaled_err(sd, sref), 0.0);

  std::vector<int64_t> rows;
  std::uniform_int_distribution<int64_t> pick(0, N - 1);
  for (int i = 0; i < 53; ++i) rows.push_back(pick(rng()));
  Tensor gref = Tensor::empty({53, C});
  const Tensor row_ids = i64_tensor(rows);
  gather_rows(host_exec(), a, row_ids, gref);
  Tensor gd = poisoned({53, C});
  gather_rows(gpu(), dev(a), dev(row_ids), gd);
  report("gather_rows", scaled_err(gd, gref), 0.0);
}

TEST_F(CudaKernels, SiluMul) {
  const Tensor g = randn({61, 129}, 3.0f), u = randn({61, 129});
  Tensor ref = Tensor::empty(g.shape());
  silu_mul_forward(host_exec(), g, u, ref);
  Tensor gd = dev(g), ud = dev(u), od = poisoned(g.shape());
  silu_mul_forward(gpu(), gd, ud, od);
  report("silu_mul", scaled_err(od, ref), 8 * twin::kEps);
  silu_mul_forward(gpu(), gd, ud, gd);  // out aliases gate
  report("silu_mul_alias", scaled_err(gd, ref), 8 * twin::kEps);
}

// Embedding: a copy, exact. Ids on the host and on the device, i32 and i64.
TEST_F(CudaKernels, Embedding) {
  const int64_t V = 1000, D = 129, T = 61;
  const Tensor table = randn({V, D});
  const Tensor table_d = dev(table);
  std::uniform_int_distribution<int64_t> pick(0, V - 1);
  for (DType dt : {DType::kI32, DType::kI64}) {
    Tensor ids = Tensor::empty({T}, dt);
    for (int64_t i = 0; i < T; ++i) {
      const int64_t id = i == 0 ? V - 1 : pick(rng());
      if (dt == DType::kI32) {
        ids.data<int32_t>()[i] = static_cast<int32_t>(id);
      } else {
        ids.data<int64_t>()[i] = id;
      }
    }
    Tensor ref = Tensor::empty({T, D});
    embedding_forward(host_exec(), ids, table, ref);
    const std::string n = dt == DType::kI32 ? "i32" : "i64";
    Tensor od = poisoned({T, D});
    embedding_forward(gpu(), dev(ids), table_d, od);
    report("embedding_" + n + "_device_ids", scaled_err(od, ref), 0.0);
    Tensor oh = poisoned({T, D});
    embedding_forward(gpu(), ids, table_d, oh);
    report("embedding_" + n + "_host_ids", scaled_err(oh, ref), 0.0);
  }
}

// Bad ids and device mismatches abort with a clear message. Death tests re-execute the binary
// ("threadsafe" style) because a forked child cannot use the parent's CUDA context.
TEST_F(CudaKernels, ChecksAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        cuda::init();
        Tensor ids = Tensor::empty({3}, DType::kI64);
        ids.data<int64_t>()[0] = 1;
        ids.data<int64_t>()[1] = 7;
        ids.data<int64_t>()[2] = 2;
        embedding_forward(gpu(), cuda::to_device(ids), cuda::to_device(Tensor::full({5, 4}, 1.0f)),
                          cuda::to_device(Tensor::full({3, 4}, 0.0f)));
      },
      "ids\\[1\\] = 7 outside");
  EXPECT_DEATH(
      {
        cuda::init();
        Tensor x = cuda::to_device(Tensor::full({2, 4}, 1.0f));
        rmsnorm_forward(gpu(), x, Tensor::full({4}, 1.0f), 1e-6f, 0.0f, x);
      },
      "must live on its execution device");
  report("checks_abort", HasFailure() ? 1.0 : 0.0, 0.0);
}

// ---------------------------------------------------------------------------------------------
// GEMM: error per element in condition units, tolerance twin::kGemmTol (twin_tolerances.h).
void check_matmul(const std::string& name, int64_t M, int64_t N, int64_t K, bool ta, bool tb,
                  float alpha, float beta, bool linear) {
  const Tensor a = ta ? randn({K, M}) : randn({M, K});
  const Tensor b = tb ? randn({N, K}) : randn({K, N});
  const Tensor c0 = randn({M, N});
  Tensor ref = c0.clone();
  Tensor absa = a.clone(), absb = b.clone(), cond = Tensor::empty({M, N});
  for (int64_t i = 0; i < absa.numel(); ++i) absa.data<float>()[i] = std::fabs(a.data<float>()[i]);
  for (int64_t i = 0; i < absb.numel(); ++i) absb.data<float>()[i] = std::fabs(b.data<float>()[i]);
  matmul(host_exec(), absa, ta, absb, tb, cond, std::fabs(alpha), 0.0f);
  Tensor od = beta == 0.0f ? poisoned({M, N}) : dev(c0);
  if (linear) {
    linear_forward(host_exec(), a, b, ref, beta);
    linear_forward(gpu(), dev(a), dev(b), od, beta);
  } else {
    matmul(host_exec(), a, ta, b, tb, ref, alpha, beta);
    matmul(gpu(), dev(a), ta, dev(b), tb, od, alpha, beta);
  }
  const Tensor got = host(od);
  double err = 0.0;
  for (int64_t i = 0; i < M * N; ++i) {
    const double g = got.data<float>()[i], r = ref.data<float>()[i];
    const double denom = cond.data<float>()[i] + std::fabs(beta * c0.data<float>()[i]) + 1e-30;
    err = std::isfinite(g) ? std::max(err, std::fabs(g - r) / denom) : INFINITY;
  }
  report(name, err, twin::kGemmTol);
}

TEST_F(CudaKernels, Gemm) {
  check_matmul("linear_M37_K129_N61", 37, 61, 129, false, true, 1.0f, 0.0f, true);
  check_matmul("linear_beta1", 37, 61, 129, false, true, 1.0f, 1.0f, true);
  // M = 1: Loom's GEMV kernel (scalar loads for K = 257, float4 loads for K = 1024) and, for
  // the other layouts, cublasSgemv.
  check_matmul("linear_M1_decode_K257", 1, 300, 257, false, true, 1.0f, 0.0f, true);
  check_matmul("linear_M1_decode_K1024", 1, 301, 1024, false, true, 1.0f, 0.0f, true);
  check_matmul("linear_M1_decode_beta1", 1, 77, 1024, false, true, 1.0f, 1.0f, true);
  check_matmul("matmul_M1_TT", 1, 77, 300, true, true, 0.75f, 0.5f, false);
  check_matmul("matmul_M1_NN", 1, 77, 300, false, false, 0.75f, 0.0f, false);
  check_matmul("matmul_M1_TN", 1, 77, 300, true, false, 0.75f, 0.5f, false);
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    check_matmul(std::string("matmul_") + (ta ? "T" : "N") + (tb ? "T" : "N"), 37, 61, 129, ta, tb,
                 0.75f, 0.5f, false);
  }
  check_matmul("matmul_K1000", 53, 71, 1000, false, false, 1.0f, 0.0f, false);
  // K = 0: out = beta * out exactly (and beta = 0 writes zeros over the NaN poison).
  for (float beta : {0.0f, 0.5f}) {
    const Tensor c0 = randn({5, 7});
    Tensor ref = c0.clone();
    matmul(host_exec(), Tensor::empty({5, 0}), false, Tensor::empty({0, 7}), false, ref, 1.0f,
           beta);
    Tensor od = beta == 0.0f ? poisoned({5, 7}) : dev(c0);
    Tensor a0 = Tensor::empty({5, 0}, DType::kF32, Device::kCuda);
    Tensor b0 = Tensor::empty({0, 7}, DType::kF32, Device::kCuda);
    matmul(gpu(), a0, false, b0, false, od, 1.0f, beta);
    report(beta == 0.0f ? "matmul_K0_beta0" : "matmul_K0_beta05", scaled_err(od, ref), 0.0);
  }
}

// ---------------------------------------------------------------------------------------------
// Causal conv1d. W taps summed in the same order; the GPU may contract to FMA where the CPU (ISO
// C++ mode, no contraction) rounds twice, and expf differs by <= 2 ulp: a few roundings, each of
// a term no larger than sum_j |w_j x_j|, which for these inputs is about max |out|. Observed
// <= 1 eps on the scaled error (H200, 13 seeds, 2026-11-30); tolerance (W + 4) eps = 8 eps. The
// state update is a copy (exact).
TEST_F(CudaKernels, CausalConv1d) {
  const int64_t C = 129, W = 4, P = W - 1;
  const double tol = (W + 4) * twin::kEps;
  for (bool silu : {false, true}) {
    const std::string tag = silu ? "_silu" : "";
    for (int64_t T : {61, 2}) {
      const Tensor x = randn({T, C}), w = randn({C, W}, 0.5f), st0 = randn({P, C});
      Tensor st = st0.clone(), ref = Tensor::empty({T, C});
      causal_conv1d_forward(host_exec(), x, w, st, silu, ref);
      Tensor xd = dev(x), wd = dev(w), std_ = dev(st0), od = poisoned({T, C});
      causal_conv1d_forward(gpu(), xd, wd, std_, silu, od);
      report("conv1d_fwd_T" + std::to_string(T) + tag, scaled_err(od, ref), tol);
      report("conv1d_fwd_state_T" + std::to_string(T) + tag, scaled_err(std_, st), 0.0);
    }
    // Prefill in pieces on the GPU (17 tokens, 1 token, the rest) equals the CPU's single pass.
    const int64_t T = 61;
    const Tensor x = randn({T, C}), w = randn({C, W}, 0.5f), st0 = randn({P, C});
    Tensor st = st0.clone(), ref = Tensor::empty({T, C});
    causal_conv1d_forward(host_exec(), x, w, st, silu, ref);
    Tensor wd = dev(w), std_ = dev(st0), od = poisoned({T, C});
    int64_t t0 = 0;
    for (int64_t len : {17, 1, 43}) {
      Tensor part = Tensor::empty({len, C});
      part.copy_from(x.slice(0, t0, t0 + len));
      causal_conv1d_forward(gpu(), dev(part), wd, std_, silu, od.slice(0, t0, t0 + len));
      t0 += len;
    }
    report("conv1d_fwd_split" + tag, scaled_err(od, ref), tol);
    report("conv1d_fwd_split_state" + tag, scaled_err(std_, st), 0.0);

    // Decode step, B sequences each with its own state.
    const int64_t B = 5;
    const Tensor xb = randn({B, C}), sb0 = randn({B, P, C});
    Tensor sb = sb0.clone(), rb = Tensor::empty({B, C});
    causal_conv1d_step(host_exec(), xb, w, sb, silu, rb);
    Tensor sbd = dev(sb0), obd = poisoned({B, C});
    causal_conv1d_step(gpu(), dev(xb), wd, sbd, silu, obd);
    report("conv1d_step" + tag, scaled_err(obd, rb), tol);
    report("conv1d_step_state" + tag, scaled_err(sbd, sb), 0.0);
  }
}

// ---------------------------------------------------------------------------------------------
// KDA. Gate: expf, log1pf and the sigmoid each within a few ulp: 16 eps on the scaled error.
TEST_F(CudaKernels, KdaGate) {
  const int64_t T = 61, H = 3, dk = 43;
  const Tensor A_log = uniform({H}, -1.0f, 1.5f);
  for (int64_t width : {H * dk, H}) {
    const Tensor f = randn({T, width}, 4.0f), bias = randn({width});
    for (float lb : {0.0f, -5.0f}) {
      for (bool with_bias : {true, false}) {
        Tensor ref = Tensor::empty(f.shape());
        const Tensor none;
        kda_gate_forward(host_exec(), f, A_log, with_bias ? bias : none, lb, ref);
        Tensor gd = poisoned(f.shape());
        kda_gate_forward(gpu(), dev(f), dev(A_log), with_bias ? dev(bias) : none, lb, gd);
        report(std::string("kda_gate_") + (lb == 0.0f ? "softplus" : "bounded") +
                   (width == H ? "_scalar" : "") + (with_bias ? "_bias" : ""),
               scaled_err(gd, ref), 16 * twin::kEps);
      }
    }
  }
}

// Recurrent KDA over many tokens: tolerance twin::kda_tol, for outputs and final state.
void check_kda(const twin::KdaCase& c) {
  const twin::KdaInputs in = twin::kda_inputs(rng(), c);
  Tensor s_ref = in.s0.clone(), o_ref = Tensor::empty({c.T, c.Hv, c.dv});
  kda_recurrent_forward(host_exec(), in.q, in.k, in.v, in.g, in.beta, in.scale, s_ref, o_ref);

  Tensor sd = dev(in.s0), od = poisoned({c.T, c.Hv, c.dv});
  kda_recurrent_forward(gpu(), dev(in.q), dev(in.k), dev(in.v), dev(in.g), dev(in.beta), in.scale,
                        sd, od);
  const std::string name = "kda_recurrent_T" + std::to_string(c.T) + "_Hv" + std::to_string(c.Hv) +
                           "_dk" + std::to_string(c.dk) + "_dv" + std::to_string(c.dv) +
                           (c.scalar_g ? "_scalarg" : "") + (c.softplus ? "_softplus" : "_bounded");
  report(name, scaled_err(od, o_ref), twin::kda_tol(c.dk));
  report(name + "_state", scaled_err(sd, s_ref), twin::kda_tol(c.dk));
}

TEST_F(CudaKernels, KdaRecurrent) {
  check_kda({500, 2, 4, 64, 72, false, false});
  check_kda({500, 1, 3, 128, 100, false, true});
  check_kda({500, 2, 6, 96, 129, true, true});  // GDN: g [T, Hv, 1], Hv = 3 Hk
  check_kda({61, 2, 2, 256, 256, false, true});
  check_kda({61, 1, 2, 37, 33, false, false});
  check_kda({1, 4, 8, 128, 128, false, false});  // one decode step
}

// ---------------------------------------------------------------------------------------------
// Batched KDA decode over a slot pool (cuda::kda_decode_batched) against cpu::kda_recurrent_forward
// with T = 1 on each sequence's slot. Tolerance twin::kda_tol (one token of the same recurrence).
// The pool has unused slots, the batch's slots are a random shuffle, and the whole pool comes back
// to check that unused slots are bit-identical to what was uploaded.
struct DecodeCase {
  int64_t B, Hk, Hv, dk, dv;
  bool scalar_g, softplus;
};

// layout 0: the host entry (layout picked by shape); 1..kKdaDecodeLayouts:
// launch::kda_decode_batched forced to that block layout.
void check_kda_decode(const DecodeCase& c, int layout = 0) {
  // kda_inputs draws [T, ...] inputs; one token of each of B sequences has the same shapes.
  const twin::KdaInputs in =
      twin::kda_inputs(rng(), {c.B, c.Hk, c.Hv, c.dk, c.dv, c.scalar_g, c.softplus});
  const int64_t num_slots = 2 * c.B + 3;
  const Tensor pool = randn({num_slots, c.Hv, c.dk, c.dv}, 0.1f);
  std::vector<int32_t> perm(static_cast<size_t>(num_slots));
  for (int64_t i = 0; i < num_slots; ++i) perm[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  std::shuffle(perm.begin(), perm.end(), rng());
  Tensor slots = Tensor::empty({c.B}, DType::kI32);
  std::copy(perm.begin(), perm.begin() + c.B, slots.data<int32_t>());

  Tensor pool_ref = pool.clone(), o_ref = Tensor::empty({c.B, c.Hv, c.dv});
  for (int64_t b = 0; b < c.B; ++b) {
    const auto row = [&](const Tensor& t) { return t.slice(0, b, b + 1); };
    cpu::kda_recurrent_forward(row(in.q), row(in.k), row(in.v), row(in.g), row(in.beta), in.scale,
                               pool_ref.select(slots.data<int32_t>()[b]), row(o_ref));
  }

  const Tensor qd = dev(in.q), kd = dev(in.k), vd = dev(in.v), gd = dev(in.g), bd = dev(in.beta);
  Tensor pd = dev(pool), sd = dev(slots), od = poisoned({c.B, c.Hv, c.dv});
  if (layout == 0) {
    cuda::kda_decode_batched(gpu(), qd, kd, vd, gd, bd, in.scale, pd, sd, od);
  } else {
    cuda::launch::kda_decode_batched(cuda::stream_of(gpu()), qd.data<float>(), kd.data<float>(),
                                     vd.data<float>(), gd.data<float>(), bd.data<float>(), in.scale,
                                     pd.data<float>(), sd.data<int32_t>(), od.data<float>(), c.B,
                                     num_slots, c.Hk, c.Hv, c.dk, c.dv, c.scalar_g, layout);
  }
  const Tensor pool_got = host(pd);
  std::string name = "kda_decode_B" + std::to_string(c.B) + "_Hk" + std::to_string(c.Hk) + "_Hv" +
                     std::to_string(c.Hv) + "_dk" + std::to_string(c.dk) + "_dv" +
                     std::to_string(c.dv) + (c.scalar_g ? "_scalarg" : "") +
                     (c.softplus ? "_softplus" : "_bounded");
  if (layout != 0) name += "_layout" + std::to_string(layout);
  report(name, scaled_err(od, o_ref), twin::kda_tol(c.dk));
  report(name + "_state", scaled_err(pool_got, pool_ref), twin::kda_tol(c.dk));
  // Unused slots: every bit as uploaded (error 1 if any differs).
  const int64_t slot_floats = c.Hv * c.dk * c.dv;
  double untouched = 0.0;
  for (int64_t s = c.B; s < num_slots; ++s) {
    const size_t off = static_cast<size_t>(perm[static_cast<size_t>(s)] * slot_floats);
    if (std::memcmp(pool_got.data<float>() + off, pool.data<float>() + off,
                    static_cast<size_t>(slot_floats) * sizeof(float)) != 0) {
      untouched = 1.0;
    }
  }
  report(name + "_unused_slots", untouched, 0.0);
}

TEST_F(CudaKernels, KdaDecodeBatched) {
  check_kda_decode({1, 32, 32, 128, 128, false, false});  // one sequence, the heads
  check_kda_decode({3, 4, 8, 128, 128, false, true});     // Hv = 2 Hk
  check_kda_decode({37, 8, 16, 128, 128, false, false});  // enough blocks for 64-column tiles
  check_kda_decode({3, 2, 4, 64, 64, true, true});        // GDN: g [B, Hv, 1]
  check_kda_decode({37, 3, 6, 96, 72, false, false});     // dv not a multiple of the tile
  check_kda_decode({37, 4, 4, 37, 33, true, false});      // dv % 4 != 0: scalar path, GDN
  check_kda_decode({1, 1, 2, 37, 33, false, true});
  check_kda_decode({3, 2, 2, 256, 256, false, true});  // the largest dk
  check_kda_decode({3, 1, 2, 256, 33, false, false});  // scalar path at the largest dk
  // Every block layout, including those the shape heuristic does not pick here.
  for (int layout = 1; layout <= cuda::launch::kKdaDecodeLayouts; ++layout) {
    check_kda_decode({3, 2, 4, 128, 128, false, false}, layout);
    check_kda_decode({3, 1, 2, 96, 72, true, true}, layout);
  }
}

// Padding and bad slots: a negative slot writes a zero out row, a slot past the pool a NaN row;
// neither touches any state, and the valid rows around them are unaffected.
TEST_F(CudaKernels, KdaDecodePaddingSlots) {
  const DecodeCase c{4, 2, 4, 64, 40, false, false};
  const twin::KdaInputs in = twin::kda_inputs(rng(), {c.B, c.Hk, c.Hv, c.dk, c.dv, false, false});
  const int64_t num_slots = 5;
  const Tensor pool = randn({num_slots, c.Hv, c.dk, c.dv}, 0.1f);
  Tensor slots = Tensor::empty({c.B}, DType::kI32);
  const int32_t ids[4] = {3, -1, 0, 7};
  std::copy(ids, ids + 4, slots.data<int32_t>());
  Tensor pool_ref = pool.clone(), o_ref = Tensor::empty({c.B, c.Hv, c.dv});
  for (int64_t b : {0, 2}) {
    const auto row = [&](const Tensor& t) { return t.slice(0, b, b + 1); };
    cpu::kda_recurrent_forward(row(in.q), row(in.k), row(in.v), row(in.g), row(in.beta), in.scale,
                               pool_ref.select(ids[b]), row(o_ref));
  }
  Tensor pd = dev(pool), od = poisoned({c.B, c.Hv, c.dv});
  cuda::kda_decode_batched(gpu(), dev(in.q), dev(in.k), dev(in.v), dev(in.g), dev(in.beta),
                           in.scale, pd, dev(slots), od);
  const Tensor o = host(od), pool_got = host(pd);
  double err = 0.0;
  for (int64_t b : {0, 2}) {
    err = std::max(
        err, twin::scaled_err(o.slice(0, b, b + 1).clone(), o_ref.slice(0, b, b + 1).clone()));
  }
  bool pad_ok = true;
  for (int64_t i = 0; i < c.Hv * c.dv; ++i) {
    pad_ok = pad_ok && o.data<float>()[c.Hv * c.dv + i] == 0.0f &&
             std::isnan(o.data<float>()[3 * c.Hv * c.dv + i]);
  }
  report("kda_decode_padding_valid_rows", err, twin::kda_tol(c.dk));
  report("kda_decode_padding_zero_and_nan_rows", pad_ok ? 0.0 : 1.0, 0.0);
  report("kda_decode_padding_state", scaled_err(pool_got, pool_ref), twin::kda_tol(c.dk));
  const int64_t slot_floats = c.Hv * c.dk * c.dv;
  double untouched = 0.0;
  for (int64_t s : {1, 2, 4}) {
    if (std::memcmp(pool_got.data<float>() + s * slot_floats, pool.data<float>() + s * slot_floats,
                    static_cast<size_t>(slot_floats) * sizeof(float)) != 0) {
      untouched = 1.0;
    }
  }
  report("kda_decode_padding_unused_slots", untouched, 0.0);
}

// ---------------------------------------------------------------------------------------------
// RoPE: the angle inv_freq * pos is the same f32 product on both sides; cosf/sinf (<= 2 ulp on
// the GPU, ~1 in glibc) and the rotation's two products and a sum: <= 8 eps |x| scaled.
TEST_F(CudaKernels, Rope) {
  const int64_t T = 61, H = 3, d = 133, off = 5;
  std::vector<int64_t> pos;
  std::uniform_int_distribution<int64_t> pick(0, 100000);
  for (int64_t t = 0; t < T; ++t) pos.push_back(pick(rng()));
  for (RopeStyle style : {RopeStyle::kHalf, RopeStyle::kInterleaved}) {
    for (bool yarn : {false, true}) {
      const RopeTable table =
          yarn ? rope_table_yarn(10000.0, 64, style, 40.0, 4096, 32, 1, 1.0, 1.0, -1.0, true)
               : rope_table_default(1e6, 126, style);
      const Tensor x = randn({T, H, d});
      Tensor ref = x.clone();
      rope_forward(host_exec(), ref, i64_tensor(pos), table, yarn ? off : 0);
      Tensor xd = dev(x);
      RopeTable table_d = table;
      table_d.inv_freq = dev(table.inv_freq);
      rope_forward(gpu(), xd, dev(i64_tensor(pos)), table_d, yarn ? off : 0);
      report(std::string("rope_") + (style == RopeStyle::kHalf ? "half" : "interleaved") +
                 (yarn ? "_yarn" : ""),
             scaled_err(xd, ref), 8 * twin::kEps);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// bf16 activations. Every input a case passes as bf16 is rounded once (as_dev): the GPU reads the
// bf16 tensor, the CPU twin the same values widened to f32. The GPU result, widened to f32, is
// compared by relative L2, ||gpu - cpu|| / ||cpu|| (rel_l2, tests/gpu/model_test_support.h).
// Both sides see identical input values, so they differ by the GPU's own f32 arithmetic (the
// f32 bounds above: ~1e-6) plus, for a bf16 output, its rounding to nearest even: at most 2^-8
// (3.9e-3, bf16 keeps 8 significant bits) relative per element, hence at most 3.9e-3 in relative
// L2; its rms over random mantissas is ~1.6e-3, as observed (H200, 2026-12-01). Bounds: 1e-2 for
// a bf16 output (the project's bf16 bound, 2.5x that worst case), 1e-4 for an f32 output (the
// project's f32 bound; observed <= 5e-7). An element left unwritten stays NaN (outputs are
// poisoned) and fails either; copies and gathers are exact.
constexpr DType kF32 = DType::kF32, kBF16 = DType::kBF16;
const char* dname(DType t) { return t == kBF16 ? "bf16" : "f32"; }
double bf16_tol(DType out) { return out == kBF16 ? 1e-2 : 1e-4; }

// `t` on the GPU as dtype `dt`; for bf16, t's own values are rounded first so that the CPU twin,
// which reads t, sees exactly what the GPU reads.
Tensor as_dev(Tensor& t, DType dt) {
  if (dt == kF32) return dev(t);
  Tensor b = Tensor::empty(t.shape(), kBF16);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const uint16_t h = f32_to_bf16(t.data<float>()[i]);
    b.data<uint16_t>()[i] = h;
    t.data<float>()[i] = bf16_to_f32(h);
  }
  return dev(b);
}
// A device tensor of `dt` full of NaN.
Tensor poisoned_as(Shape shape, DType dt) {
  Tensor nan = Tensor::full(shape, std::nanf(""));
  return as_dev(nan, dt);
}
void report_l2(const std::string& name, const Tensor& got_dev, const Tensor& ref, DType out) {
  report(name, rel_l2(host(got_dev).to_f32(), ref), bf16_tol(out));
}
// The (a, b) dtype pairs other than f32/f32 (which the tests above cover).
const std::vector<std::pair<DType, DType>> kMixedPairs = {
    {kF32, kBF16}, {kBF16, kF32}, {kBF16, kBF16}};
std::string pair_name(DType a, DType b) { return std::string(dname(a)) + "_" + dname(b); }

// x f32 (the residual) or bf16 into out f32 or bf16; D = 129 (scalar path), 1028 (16-byte units
// for f32 only), 4096 (units of 8 either way): a block per row; D = 40 (scalar) and 128 (KDA's
// o_norm): a warp per row. In place on bf16 as KDA's o_norm does.
TEST_F(CudaKernels, RmsNormBf16) {
  for (int64_t D : {40, 128, 129, 1028, 4096}) {
    for (float offset : {0.0f, 1.0f}) {
      const int64_t N = 37;
      const Tensor x0 = randn({N, D}, 2.0f), w = randn({D}, 0.5f);
      const Tensor wd = dev(w);
      const std::string tag = "_D" + std::to_string(D) + "_off" + std::to_string(int(offset));
      for (auto [xt, ot] : kMixedPairs) {
        Tensor x = x0.clone(), ref = Tensor::empty({N, D});
        const Tensor xd = as_dev(x, xt), od = poisoned_as({N, D}, ot);
        rmsnorm_forward(host_exec(), x, w, 1e-6f, offset, ref);
        rmsnorm_forward(gpu(), xd, wd, 1e-6f, offset, od);
        report_l2("rmsnorm_" + pair_name(xt, ot) + tag, od, ref, ot);
        if (xt == ot) {
          rmsnorm_forward(gpu(), xd, wd, 1e-6f, offset, xd);  // out aliases x
          report_l2("rmsnorm_alias_" + pair_name(xt, ot) + tag, xd, ref, ot);
        }
      }
    }
  }
}

// add_rmsnorm_forward against what it fuses, add_inplace then rmsnorm_forward on the GPU: the
// same bits in h and in out (0 differing elements, NaN poisoning included), for h f32 (the
// model's residual) or bf16, delta and out f32 or bf16 (one dtype, as the model passes them),
// widths that take the warp kernel (40, 128), the scalar block path (129) and 16-byte units
// (1028 for f32, 2304 as the 48B model, 4096), in place (out = h, the final norm) and not; and
// against the CPU twin (add then norm in f32 on the same rounded inputs) within the bf16 bounds.
TEST_F(CudaKernels, AddRmsNormIsAddThenNorm) {
  auto differing = [](const Tensor& a, const Tensor& b) {
    const Tensor ha = host(a), hb = host(b);
    int64_t n = 0;
    const size_t item = dtype_size(ha.dtype());
    for (int64_t i = 0; i < ha.numel(); ++i) {
      n += std::memcmp(static_cast<const char*>(ha.raw()) + i * item,
                       static_cast<const char*>(hb.raw()) + i * item, item) != 0;
    }
    return n;
  };
  for (int64_t D : {40, 128, 129, 1028, 2304, 4096}) {
    for (DType ht : {kF32, kBF16}) {
      for (DType at : {kF32, kBF16}) {
        const int64_t N = 13;
        Tensor h0 = randn({N, D}, 2.0f), delta = randn({N, D}, 1.0f), w = randn({D}, 0.5f);
        const Tensor wd = dev(w), dd = as_dev(delta, at);
        const std::string tag =
            "_h" + std::string(dname(ht)) + "_d" + dname(at) + "_D" + std::to_string(D);
        for (bool in_place : {false, true}) {
          Tensor h_ref = h0.clone(), h_copy = h0.clone();
          const Tensor h_unfused = as_dev(h_ref, ht), h_fused = as_dev(h_copy, ht);
          const Tensor o_unfused = in_place ? h_unfused : poisoned_as({N, D}, at);
          const Tensor o_fused =
              in_place ? h_fused : poisoned_as({N, D}, at);  // in place: h's type
          add_inplace(gpu(), h_unfused, dd);
          rmsnorm_forward(gpu(), h_unfused, wd, 1e-5f, 0.0f, o_unfused);
          add_rmsnorm_forward(gpu(), h_fused, dd, wd, 1e-5f, 0.0f, o_fused);
          const std::string name = std::string("add_rmsnorm") + (in_place ? "_inplace" : "") + tag;
          // In place with delta's dtype not h's (the model's final norm: h f32, delta bf16, out =
          // h) the norm moves 8-element units where the plain f32 norm takes 4: another summation
          // order, so only the CPU bound holds there (norm.h).
          if (!in_place || ht == at) {
            const int64_t diff = differing(h_fused, h_unfused) + differing(o_fused, o_unfused);
            report(name + "_bits_vs_unfused", static_cast<double>(diff), 0.0);
          }
          Tensor ref = Tensor::empty({N, D});
          add_rmsnorm_forward(host_exec(), h_ref, delta, w, 1e-5f, 0.0f, ref);
          // A bf16 h holds the sum rounded before the norm reads it: the bf16 bound then too.
          const DType out_type = in_place ? ht : at;
          report(name + "_vs_cpu", rel_l2(host(o_fused).to_f32(), ref),
                 bf16_tol(ht == kBF16 ? kBF16 : out_type));
        }
      }
    }
  }
}

// q and k: bf16 in place; the other pairs too (d = 129 scalar, 128 vectorised: a warp per row,
// 40 scalar: a warp per row).
TEST_F(CudaKernels, L2NormBf16) {
  for (int64_t d : {129, 128, 40}) {
    const Tensor x0 = randn({61, 3, d}, 1.5f);
    for (auto [xt, ot] : kMixedPairs) {
      Tensor x = x0.clone(), ref = Tensor::empty(x0.shape());
      const Tensor xd = as_dev(x, xt), od = poisoned_as(x0.shape(), ot);
      l2norm_forward(host_exec(), x, 1e-6f, 0.7f, ref);
      l2norm_forward(gpu(), xd, 1e-6f, 0.7f, od);
      const std::string tag = "_d" + std::to_string(d);
      report_l2("l2norm_" + pair_name(xt, ot) + tag, od, ref, ot);
      if (xt == ot) {
        l2norm_forward(gpu(), xd, 1e-6f, 0.7f, xd);
        report_l2("l2norm_alias_" + pair_name(xt, ot) + tag, xd, ref, ot);
      }
    }
  }
}

// The in-place ops with x and the second operand each f32 or bf16: x [37, 129] (4773 elements:
// 16-byte units and a tail), and once on views one element in (not 16-byte aligned: the scalar
// path).
TEST_F(CudaKernels, ElementwiseBf16) {
  const int64_t N = 37, C = 129;
  const Tensor a0 = randn({N, C}, 3.0f), b0 = randn({N, C}, 3.0f);
  const Tensor bias = randn({C}), grow0 = randn({N}, 2.0f);
  // op(x, y) on both sides, x and y of the given dtypes; x is the output.
  auto run = [&](const std::string& name, DType xt, DType yt, const Tensor& y0, auto&& op,
                 bool misaligned = false) {
    Tensor x = a0.clone(), y = y0.clone();
    Tensor xd = as_dev(x, xt), yd = as_dev(y, yt);
    op(host_exec(), x, y);
    if (misaligned) {
      const int64_t n = x.numel();
      const Tensor xv = xd.reshape({n}).slice(0, 1, n), yv = yd.reshape({y.numel()});
      op(gpu(), xv, yv.slice(0, 1, n));
      x = x.reshape({n}).slice(0, 1, n).clone();
      report_l2(name + "_" + pair_name(xt, yt) + "_misaligned", xv, x, xt);
      return;
    }
    op(gpu(), xd, yd);
    report_l2(name + "_" + pair_name(xt, yt), xd, x, xt);
  };
  for (auto [xt, yt] : kMixedPairs) {
    run("add_inplace", xt, yt, b0,
        [](const Exec& ex, const Tensor& x, const Tensor& y) { add_inplace(ex, x, y); });
    run(
        "add_inplace", xt, yt, b0,
        [](const Exec& ex, const Tensor& x, const Tensor& y) { add_inplace(ex, x, y); }, true);
    run("mul_sigmoid_inplace", xt, yt, b0,
        [](const Exec& ex, const Tensor& x, const Tensor& y) { mul_sigmoid_inplace(ex, x, y); });
    run("mul_silu_inplace", xt, yt, b0,
        [](const Exec& ex, const Tensor& x, const Tensor& y) { mul_silu_inplace(ex, x, y); });
    run(
        "mul_silu_inplace", xt, yt, b0,
        [](const Exec& ex, const Tensor& x, const Tensor& y) { mul_silu_inplace(ex, x, y); }, true);
    // gate [N] and, for bf16 x, [N, 1].
    run("mul_sigmoid_rows", xt, yt, grow0,
        [](const Exec& ex, const Tensor& x, const Tensor& y) { mul_sigmoid_rows(ex, x, y); });
    if (xt == kBF16) {
      run("mul_sigmoid_rows_col", xt, yt, grow0.reshape({N, 1}),
          [](const Exec& ex, const Tensor& x, const Tensor& y) { mul_sigmoid_rows(ex, x, y); });
    }
  }
  const Tensor biasd = dev(bias);
  {
    Tensor x = a0.clone();
    const Tensor xd = as_dev(x, kBF16);
    add_bias(host_exec(), x, bias);
    add_bias(gpu(), xd, biasd);
    report_l2("add_bias_bf16", xd, x, kBF16);
  }
  {
    Tensor x = a0.clone();
    const Tensor xd = as_dev(x, kBF16);
    sigmoid_inplace(host_exec(), x);
    sigmoid_inplace(gpu(), xd);
    report_l2("sigmoid_inplace_bf16", xd, x, kBF16);
  }

  // Column copies (converting where the dtypes differ) and row gathers.
  const int64_t c0 = 17, cw = 45;
  const Tensor small0 = randn({N, cw});
  std::vector<int64_t> rows;
  std::uniform_int_distribution<int64_t> pick(0, N - 1);
  for (int i = 0; i < 53; ++i) rows.push_back(pick(rng()));
  const Tensor row_ids = i64_tensor(rows), row_ids_d = dev(row_ids);
  for (auto [st, dt] : kMixedPairs) {
    Tensor src = a0.clone(), ref = Tensor::empty({N, cw});
    const Tensor sd = as_dev(src, st), cd = poisoned_as({N, cw}, dt);
    copy_columns(host_exec(), src, c0, ref);
    copy_columns(gpu(), sd, c0, cd);
    report_l2("copy_columns_" + pair_name(st, dt), cd, ref, dt);

    Tensor small = small0.clone(), wide = a0.clone();
    const Tensor smd = as_dev(small, st), wd = as_dev(wide, dt);
    scatter_columns(host_exec(), small, c0, wide);
    scatter_columns(gpu(), smd, c0, wd);
    report_l2("scatter_columns_" + pair_name(st, dt), wd, wide, dt);

    Tensor gref = Tensor::empty({53, C}), gd = poisoned_as({53, C}, dt);
    gather_rows(host_exec(), src, row_ids, gref);
    gather_rows(gpu(), sd, row_ids_d, gd);
    report_l2("gather_rows_" + pair_name(st, dt), gd, gref, dt);
  }
}

// The dense FFN's SwiGLU: gate, up and out each f32 or bf16; out aliasing a bf16 gate.
TEST_F(CudaKernels, SiluMulBf16) {
  const Tensor g0 = randn({61, 129}, 3.0f), u0 = randn({61, 129});
  for (DType gt : {kF32, kBF16}) {
    for (DType ut : {kF32, kBF16}) {
      for (DType ot : {kF32, kBF16}) {
        if (gt == kF32 && ut == kF32 && ot == kF32) continue;
        Tensor g = g0.clone(), u = u0.clone(), ref = Tensor::empty(g0.shape());
        const Tensor gd = as_dev(g, gt), ud = as_dev(u, ut), od = poisoned_as(g0.shape(), ot);
        silu_mul_forward(host_exec(), g, u, ref);
        silu_mul_forward(gpu(), gd, ud, od);
        const std::string name =
            std::string("silu_mul_") + dname(gt) + "_" + dname(ut) + "_" + dname(ot);
        report_l2(name, od, ref, ot);
        if (gt == ot) {
          silu_mul_forward(gpu(), gd, ud, gd);
          report_l2(name + "_alias", gd, ref, ot);
        }
      }
    }
  }
}

// A bf16 table into the f32 residual (and the other pairs), ids on the device and on the host.
TEST_F(CudaKernels, EmbeddingBf16) {
  const int64_t V = 1000, D = 129, T = 61;
  const Tensor table0 = randn({V, D});
  std::uniform_int_distribution<int64_t> pick(0, V - 1);
  Tensor ids = Tensor::empty({T}, DType::kI64);
  for (int64_t i = 0; i < T; ++i) ids.data<int64_t>()[i] = i == 0 ? V - 1 : pick(rng());
  const Tensor ids_d = dev(ids);
  for (auto [tt, ot] : kMixedPairs) {
    Tensor table = table0.clone(), ref = Tensor::empty({T, D});
    const Tensor td = as_dev(table, tt);
    embedding_forward(host_exec(), ids, table, ref);
    Tensor od = poisoned_as({T, D}, ot), oh = poisoned_as({T, D}, ot);
    embedding_forward(gpu(), ids_d, td, od);
    embedding_forward(gpu(), ids, td, oh);
    report_l2("embedding_" + pair_name(tt, ot) + "_device_ids", od, ref, ot);
    report_l2("embedding_" + pair_name(tt, ot) + "_host_ids", oh, ref, ot);
  }
}

// The KDA/GDN gate from a bf16 projection f; g stays f32.
TEST_F(CudaKernels, KdaGateBf16) {
  const int64_t T = 61, H = 3, dk = 43;
  const Tensor A_log = uniform({H}, -1.0f, 1.5f);
  const Tensor A_log_d = dev(A_log);
  for (int64_t width : {H * dk, H}) {
    const Tensor bias = randn({width});
    for (float lb : {0.0f, -5.0f}) {
      Tensor f = randn({T, width}, 4.0f), ref = Tensor::empty({T, width});
      const Tensor fd = as_dev(f, kBF16), gd = poisoned({T, width});
      kda_gate_forward(host_exec(), f, A_log, bias, lb, ref);
      kda_gate_forward(gpu(), fd, A_log_d, dev(bias), lb, gd);
      report_l2(std::string("kda_gate_bf16_") + (lb == 0.0f ? "softplus" : "bounded") +
                    (width == H ? "_scalar" : ""),
                gd, ref, kF32);
    }
  }
}

// RoPE in place on bf16 q/k: both styles, full and partial rotary dims, default and YaRN.
TEST_F(CudaKernels, RopeBf16) {
  const int64_t T = 61, H = 3, d = 133, off = 5;
  std::vector<int64_t> pos;
  std::uniform_int_distribution<int64_t> pick(0, 100000);
  for (int64_t t = 0; t < T; ++t) pos.push_back(pick(rng()));
  const Tensor pos_h = i64_tensor(pos), pos_d = dev(pos_h);
  for (RopeStyle style : {RopeStyle::kHalf, RopeStyle::kInterleaved}) {
    for (bool yarn : {false, true}) {
      const RopeTable table =
          yarn ? rope_table_yarn(10000.0, 64, style, 40.0, 4096, 32, 1, 1.0, 1.0, -1.0, true)
               : rope_table_default(1e6, 126, style);
      Tensor x = randn({T, H, d});
      const Tensor xd = as_dev(x, kBF16);
      rope_forward(host_exec(), x, pos_h, table, yarn ? off : 0);
      RopeTable table_d = table;
      table_d.inv_freq = dev(table.inv_freq);
      rope_forward(gpu(), xd, pos_d, table_d, yarn ? off : 0);
      report_l2(std::string("rope_bf16_") + (style == RopeStyle::kHalf ? "half" : "interleaved") +
                    (yarn ? "_yarn" : ""),
                xd, x, kBF16);
    }
  }
}

// bf16 stays off the CPU kernels and the backward passes, and a write over an input of another
// dtype is refused, each with a message naming the problem.
TEST_F(CudaKernels, Bf16ChecksAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        Tensor x = Tensor::empty({2, 4}, kBF16);
        rmsnorm_forward(host_exec(), x, Tensor::full({4}, 1.0f), 1e-6f, 0.0f,
                        Tensor::empty({2, 4}));
      },
      "expected contiguous f32, got bf16");
  EXPECT_DEATH(
      {
        const RopeTable table = rope_table_default(1e4, 4, RopeStyle::kHalf);
        rope_backward(host_exec(), Tensor::empty({1, 1, 4}, kBF16), i64_tensor({0}), table, 0);
      },
      "expected contiguous f32 \\(or bf16, in the CUDA forward only\\)");
  EXPECT_DEATH(
      {
        cuda::init();
        Tensor buf = Tensor::empty({16}, kF32, Device::kCuda);
        const Tensor x = buf.reshape({2, 8});
        const Tensor out = Tensor::wrap(buf.raw(), {2, 8}, kBF16, Device::kCuda);
        rmsnorm_forward(gpu(), x, dev(Tensor::full({8}, 1.0f)), 1e-6f, 0.0f, out);
      },
      "in place only with the same dtype");
  report("bf16_checks_abort", HasFailure() ? 1.0 : 0.0, 0.0);
}

}  // namespace
}  // namespace loom
