// CUDA GEMMs (kernels/cuda/gemm.h) against the CPU twin, and batch invariance on the GPU. Fresh
// random inputs every run (the seed is printed; LOOM_GPU_TEST_SEED replays one), sizes that are
// multiples of nothing (N = 1000 or 999, K = 777 or 1024: K = 777 leaves bf16 rows unaligned for
// cuBLASLt, N = 999 leaves f32 output rows 4-byte aligned only), outputs poisoned with NaN before
// every beta = 0 run. Prints "GPUCHECK <name> <error> <tolerance> <PASS|FAIL>" lines for
// tests/gpu/run.sh.
//
// Error measures (eps = FLT_EPSILON):
//  - cond: max over elements of |gpu - cpu| / ((|x| |w|^T)_ij + |beta out0_ij|), condition units
//    (tests/gpu/twin_tolerances.h, kGemmTol = 16 eps, explains why they fit any summation order);
//  - rel_l2: ||gpu - cpu||_2 / ||cpu||_2.
// Bounds:
//  - f32 weights (cuBLAS, Loom's GEMV, Loom's batch-invariant FMA kernel): cond <= kGemmTol.
//  - bf16 weights, kernels that use x as it is (the GEMV for f32 x; any kernel for bf16 x): cond
//    <= kGemmTol against the CPU twin fed the same bf16 weights (the products of a bf16 weight
//    and an f32 x round in f32 on both sides).
//  - bf16 weights, kernels that round f32 x to bf16 (cuBLASLt, Loom's tensor-core kernel): the
//    kernel is measured against the CPU twin fed the bf16-rounded x (the same exact products):
//    cond <= kBf16KernelTol = 64 eps, looser than kGemmTol because tensor cores add each mma's
//    16 products inside the instruction, by rules NVIDIA does not document (truncation instead of
//    rounding would bias the sum by up to 1 ulp per k16 step: about 6 eps in condition units at
//    K = 4096 for zero-mean data). Against the twin fed f32 x, what x's rounding costs:
//    rel_l2 <= 1e-2 (x's relative rounding error is at most 2^-8, about 2.3e-3 rms for random
//    data, and the output's relative L2 error is about that).
//  - bf16 output: the above plus the output's rounding, |gpu - cpu| <= 2^-8 |cpu| + 64 eps cond;
//    the error printed is the largest ratio of the two sides (bound 1). The bound is tight by
//    construction: rounding to nearest reaches nearly 2^-8 |cpu| just above a power of two, so
//    ratios near 1 are expected; a wrong element is off by far more.
// Observed on an H200 (seed 1869111787, 223 checks): f32 cond 3.6e-7 (3 eps; cuBLAS 1.1e-7),
// bf16 kernels against the rounded x 3.1e-7 (2.6 eps; cuBLASLt 7.1e-8), the GEMV 5.6e-8,
// x's rounding rel_l2 1.9e-3, bf16 output ratio 0.98; every invariance check 0 rows differing.
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

#include "core/workspace.h"
#include "kernels/activation.h"
#include "kernels/batch_invariance.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/graph.h"
#include "kernels/norm.h"
#include "kernels/side_stream.h"
#include "tests/gpu/gpu_test_support.h"
#include "tests/gpu/twin_tolerances.h"

namespace loom {
namespace {

constexpr double kBf16KernelTol = 64 * twin::kEps;
constexpr double kRoundingRelL2Tol = 1e-2;
constexpr double kBf16OutUnit = 1.0 / 256;  // bf16 unit roundoff, 2^-8

std::mt19937_64& rng() {
  static std::mt19937_64 r(gpu_test_seed());
  return r;
}
Tensor randn(Shape shape, float scale = 1.0f) { return twin::randn(rng(), shape, scale); }

const Exec& gpu() {
  static const Exec ex = cuda::device_exec(0);
  return ex;
}
Exec gpu_invariant() {
  Exec ex = gpu();
  ex.batch_invariant = true;
  return ex;
}
Tensor dev(const Tensor& h) { return cuda::to_device(h); }
Tensor host(const Tensor& d) { return cuda::to_host(d); }

// A host bf16 tensor holding f32 values rounded to nearest even; and the f32 values it holds.
Tensor to_bf16(const Tensor& f32) {
  Tensor t = Tensor::empty(f32.shape(), DType::kBF16);
  for (int64_t i = 0; i < f32.numel(); ++i) {
    t.data<uint16_t>()[i] = f32_to_bf16(f32.data<float>()[i]);
  }
  return t;
}
Tensor rounded(const Tensor& f32) { return to_bf16(f32).to_f32(); }
Tensor abs_of(const Tensor& t) {
  Tensor a = t.clone();
  for (int64_t i = 0; i < a.numel(); ++i) a.data<float>()[i] = std::fabs(a.data<float>()[i]);
  return a;
}
// A device output: NaN everywhere (beta = 0) or the given start values, as f32 or bf16.
Tensor device_out(const Tensor& out0, float beta, DType dtype) {
  Tensor h = beta == 0.0f ? Tensor::full(out0.shape(), std::nanf("")) : out0.clone();
  return dev(dtype == DType::kBF16 ? to_bf16(h) : h);
}

void report(const std::string& name, double err, double tol) {
  const bool pass = err <= tol;  // false for NaN
  std::printf("GPUCHECK %s %.3e %.3e %s\n", name.c_str(), err, tol, pass ? "PASS" : "FAIL");
  std::fflush(stdout);
  EXPECT_LE(err, tol) << name;
}

// What a GPU result is compared with: the CPU twin's result and the condition numbers
// (|x| |w|^T + |beta out0|) of each element.
struct Reference {
  Tensor out, cond;
};
// out = x w^T + beta out0 on the CPU (w f32, or bf16 as stored), and its condition numbers.
Reference cpu_reference(const Tensor& x, const Tensor& w, const Tensor& out0, float beta) {
  Reference r{out0.clone(), Tensor::empty(out0.shape())};
  linear_forward(host_exec(), x, w, r.out, beta);
  const Tensor wf = w.dtype() == DType::kF32 ? w : w.to_f32();
  linear_forward(host_exec(), abs_of(x), abs_of(wf), r.cond, 0.0f);
  for (int64_t i = 0; i < r.cond.numel(); ++i) {
    r.cond.data<float>()[i] += std::fabs(beta * out0.data<float>()[i]);
  }
  return r;
}

double cond_err(const Tensor& got_dev, const Reference& ref) {
  const Tensor got = host(got_dev).to_f32();
  double err = 0.0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.data<float>()[i], r = ref.out.data<float>()[i];
    if (!std::isfinite(g)) return INFINITY;
    err = std::max(err, std::fabs(g - r) / (ref.cond.data<float>()[i] + 1e-30));
  }
  return err;
}
double rel_l2(const Tensor& got_dev, const Reference& ref) {
  const Tensor got = host(got_dev).to_f32();
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.data<float>()[i], r = ref.out.data<float>()[i];
    if (!std::isfinite(g)) return INFINITY;
    num += (g - r) * (g - r);
    den += r * r;
  }
  return std::sqrt(num / std::max(den, 1e-300));
}
// bf16 output: max |g - r| / (2^-8 |r| + kBf16KernelTol cond).
double bf16_out_err(const Tensor& got_dev, const Reference& ref) {
  const Tensor got = host(got_dev).to_f32();
  double err = 0.0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.data<float>()[i], r = ref.out.data<float>()[i];
    if (!std::isfinite(g)) return INFINITY;
    const double allowed =
        kBf16OutUnit * std::fabs(r) + kBf16KernelTol * ref.cond.data<float>()[i] + 1e-30;
    err = std::max(err, std::fabs(g - r) / allowed);
  }
  return err;
}

std::string case_name(const std::string& what, int64_t M, int64_t N, int64_t K, float beta) {
  return what + "_M" + std::to_string(M) + "_N" + std::to_string(N) + "_K" + std::to_string(K) +
         "_b" + std::to_string(static_cast<int>(beta));
}

struct Shape2 {
  int64_t N, K;
};
constexpr Shape2 kShapes[] = {{1000, 777}, {999, 1024}};
constexpr int64_t kRows[] = {1, 3, 17, 130};

class GemmCuda : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cuda::init();
    (void)gpu_test_seed();
  }
};

// ---------------------------------------------------------------------------------------------
// f32 weights: cuBLAS / Loom's GEMV (default) and Loom's FMA kernel (batch-invariant).
TEST_F(GemmCuda, F32Weights) {
  for (const Shape2 s : kShapes) {
    for (int64_t M : kRows) {
      for (float beta : {0.0f, 1.0f}) {
        const Tensor x = randn({M, s.K}), w = randn({s.N, s.K}), out0 = randn({M, s.N});
        const Reference ref = cpu_reference(x, w, out0, beta);
        const Tensor xd = dev(x), wd = dev(w);
        Tensor od = device_out(out0, beta, DType::kF32);
        linear_forward(gpu(), xd, wd, od, beta);
        report(case_name("f32", M, s.N, s.K, beta), cond_err(od, ref), twin::kGemmTol);
        od = device_out(out0, beta, DType::kF32);
        linear_forward(gpu_invariant(), xd, wd, od, beta);
        report(case_name("f32_invariant", M, s.N, s.K, beta), cond_err(od, ref), twin::kGemmTol);
      }
    }
  }
}

// Batch-invariant matmul, every transpose combination, alpha and beta.
TEST_F(GemmCuda, F32MatmulInvariant) {
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    for (int64_t M : {1, 37, 130}) {
      const int64_t N = 61, K = 129;
      const float alpha = 0.75f, beta = M == 37 ? 0.0f : 0.5f;
      const Tensor a = ta ? randn({K, M}) : randn({M, K});
      const Tensor b = tb ? randn({N, K}) : randn({K, N});
      const Tensor c0 = randn({M, N});
      Tensor ref = c0.clone(), cond = Tensor::empty({M, N});
      matmul(host_exec(), a, ta, b, tb, ref, alpha, beta);
      matmul(host_exec(), abs_of(a), ta, abs_of(b), tb, cond, std::fabs(alpha), 0.0f);
      for (int64_t i = 0; i < cond.numel(); ++i) {
        cond.data<float>()[i] += std::fabs(beta * c0.data<float>()[i]);
      }
      Tensor od = device_out(c0, beta, DType::kF32);
      matmul(gpu_invariant(), dev(a), ta, dev(b), tb, od, alpha, beta);
      report(std::string("matmul_invariant_") + (ta ? "T" : "N") + (tb ? "T" : "N") + "_M" +
                 std::to_string(M),
             cond_err(od, Reference{ref, cond}), twin::kGemmTol);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// bf16 weights, f32 x: linear_forward's choice, then each kernel forced.
TEST_F(GemmCuda, Bf16WeightsF32Activations) {
  for (const Shape2 s : kShapes) {
    for (int64_t M : kRows) {
      for (float beta : {0.0f, 1.0f}) {
        const Tensor x = randn({M, s.K}), out0 = randn({M, s.N});
        const Tensor w = to_bf16(randn({s.N, s.K}));
        const Reference ref = cpu_reference(x, w, out0, beta);             // f32 x
        const Reference ref_r = cpu_reference(rounded(x), w, out0, beta);  // bf16-rounded x
        const Tensor xd = dev(x), wd = dev(w);
        auto run = [&](cuda::Bf16Gemm kernel, const Exec& ex) {
          Tensor od = device_out(out0, beta, DType::kF32);
          cuda::linear_forward_bf16(ex, xd, wd, od, beta, kernel);
          return od;
        };
        // linear_forward (through the dispatch): the GEMV up to kGemvAutoRows rows (x as it is),
        // then cuBLASLt (K = 1024) or Loom's tensor-core kernel (K = 777), x rounded.
        Tensor od = device_out(out0, beta, DType::kF32);
        linear_forward(gpu(), xd, wd, od, beta);
        const bool rounds = M > cuda::kGemvAutoRows;
        report(case_name("bf16w_auto_relL2", M, s.N, s.K, beta), rel_l2(od, ref),
               kRoundingRelL2Tol);
        report(case_name(rounds ? "bf16w_auto_cond_vs_rounded_x" : "bf16w_auto_cond", M, s.N, s.K,
                         beta),
               cond_err(od, rounds ? ref_r : ref), rounds ? kBf16KernelTol : twin::kGemmTol);
        if (M <= 8) {
          report(case_name("bf16w_gemv_cond", M, s.N, s.K, beta),
                 cond_err(run(cuda::Bf16Gemm::kGemv, gpu()), ref), twin::kGemmTol);
        }
        report(case_name("bf16w_tiled_cond_vs_rounded_x", M, s.N, s.K, beta),
               cond_err(run(cuda::Bf16Gemm::kTiled, gpu()), ref_r), kBf16KernelTol);
        if (s.K % 8 == 0) {
          report(case_name("bf16w_cublaslt_cond_vs_rounded_x", M, s.N, s.K, beta),
                 cond_err(run(cuda::Bf16Gemm::kCublasLt, gpu()), ref_r), kBf16KernelTol);
        }
        od = device_out(out0, beta, DType::kF32);
        linear_forward(gpu_invariant(), xd, wd, od, beta);
        report(case_name("bf16w_invariant_cond_vs_rounded_x", M, s.N, s.K, beta),
               cond_err(od, ref_r), kBf16KernelTol);
        report(case_name("bf16w_invariant_relL2", M, s.N, s.K, beta), rel_l2(od, ref),
               kRoundingRelL2Tol);
      }
    }
  }
}

// The GEMV's split of k (1, 2, 4 or 8 warps per weight row, chosen from n and k): every split,
// with and without 16-byte loads, bf16 and f32 x, against the twin; and a row's bits the same
// whether the call has 1 or 8 rows (the split never depends on the row count).
TEST_F(GemmCuda, Bf16GemvSplits) {
  // (n, k): split 1 (vec), 2 (vec), 4 (vec), 8 (vec), 8 (k % 8 != 0), 2 (k % 8 != 0), tiny n.
  constexpr Shape2 kGemvShapes[] = {{9000, 520}, {3000, 1000}, {1500, 2048}, {130, 4096},
                                    {37, 4100},  {1001, 1001}, {5, 2307}};
  for (const Shape2 s : kGemvShapes) {
    const Tensor w = to_bf16(randn({s.N, s.K}));
    const Tensor wd = dev(w);
    for (const bool bf16_x : {false, true}) {
      const Tensor x8 = bf16_x ? to_bf16(randn({8, s.K})) : randn({8, s.K});
      const Tensor x8f = bf16_x ? x8.to_f32() : x8;
      const Tensor out0 = rounded(randn({8, s.N}));
      for (int64_t M : {1, 3, 8}) {
        for (float beta : {0.0f, 1.0f}) {
          const Tensor xm = x8.slice(0, 0, M).clone();
          const Tensor om = out0.slice(0, 0, M).clone();
          const Reference ref = cpu_reference(x8f.slice(0, 0, M).clone(), w, om, beta);
          Tensor od = device_out(om, beta, DType::kF32);
          cuda::linear_forward_bf16(gpu(), dev(xm), wd, od, beta, cuda::Bf16Gemm::kGemv);
          report(case_name(bf16_x ? "gemv_split_bf16x" : "gemv_split_f32x", M, s.N, s.K, beta),
                 cond_err(od, ref), twin::kGemmTol);
        }
      }
      // Row 0 alone vs row 0 of the 8-row call: the same bits.
      Tensor one = device_out(out0.slice(0, 0, 1).clone(), 0.0f, DType::kF32);
      Tensor eight = device_out(out0, 0.0f, DType::kF32);
      cuda::linear_forward_bf16(gpu(), dev(x8.slice(0, 0, 1).clone()), wd, one, 0.0f,
                                cuda::Bf16Gemm::kGemv);
      cuda::linear_forward_bf16(gpu(), dev(x8), wd, eight, 0.0f, cuda::Bf16Gemm::kGemv);
      const Tensor h1 = host(one), h8 = host(eight);
      const bool same = std::memcmp(h1.raw(), h8.raw(), h1.nbytes()) == 0;
      report(case_name(bf16_x ? "gemv_split_rows_same_bits_bf16x" : "gemv_split_rows_same_bits", 1,
                       s.N, s.K, 0.0f),
             same ? 0.0 : 1.0, 0.0);
    }
  }
}

// linear_swiglu_forward's fused GEMV against the composition it replaces (two GEMVs into h's
// type, then silu_mul_forward; both on the GPU): the same bits, for 1 to 4 rows (the fused
// case's range; 5 rows take the composition itself), x and h each f32 or bf16, every split of k
// and the scalar path (k % 8 != 0). The composition's kernels have their own CPU-twin tests.
TEST_F(GemmCuda, Bf16SwigluGemvIsTwoGemvsAndSiluMul) {
  constexpr Shape2 kSwigluShapes[] = {
      {1024, 2304}, {9216, 2304}, {37, 4100}, {1001, 1001}, {5, 2307}};
  const Exec& ex = gpu();
  for (const Shape2 s : kSwigluShapes) {
    const Tensor wg = dev(to_bf16(randn({s.N, s.K}, 0.05f)));
    const Tensor wu = dev(to_bf16(randn({s.N, s.K}, 0.05f)));
    for (const DType xt : {DType::kF32, DType::kBF16}) {
      for (const DType ht : {DType::kF32, DType::kBF16}) {
        for (int64_t M : {1, 2, 4, 5}) {
          const Tensor x = randn({M, s.K});
          const Tensor xd = dev(xt == DType::kBF16 ? to_bf16(x) : x);
          const Tensor nan = Tensor::full({M, s.N}, std::nanf(""));
          Tensor fused = dev(ht == DType::kBF16 ? to_bf16(nan) : nan);
          linear_swiglu_forward(ex, xd, wg, wu, fused);
          Tensor g = Tensor::empty({M, s.N}, ht, Device::kCuda);
          Tensor u = Tensor::empty({M, s.N}, ht, Device::kCuda);
          Tensor h = Tensor::empty({M, s.N}, ht, Device::kCuda);
          linear_forward(ex, xd, wg, g);
          linear_forward(ex, xd, wu, u);
          silu_mul_forward(ex, g, u, h);
          const Tensor a = host(fused), b = host(h);
          const bool same = std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
          std::string name = std::string("swiglu_gemv_") + (xt == DType::kBF16 ? "bf16x" : "f32x") +
                             (ht == DType::kBF16 ? "_bf16h" : "_f32h");
          report(case_name(name + "_bits_vs_composed", M, s.N, s.K, 0.0f), same ? 0.0 : 1.0, 0.0);
        }
      }
    }
  }
}

// f32 w with bf16 x (an MoE router on bf16 activations) into f32 out: the bits of the same call
// on x widened to f32 first, for one row (the GEMV, every split of k and the scalar path) and more
// (widened into the workspace), with and without batch invariance.
TEST_F(GemmCuda, F32WeightsBf16RowsAreTheWidenedRows) {
  constexpr Shape2 kRouterShapes[] = {{256, 2304}, {384, 7168}, {60, 2048}, {37, 4100}, {5, 1001}};
  for (const Shape2 s : kRouterShapes) {
    const Tensor wd = dev(randn({s.N, s.K}, 0.05f));
    for (int64_t M : {1, 3, 17}) {
      const Tensor xb = to_bf16(randn({M, s.K}));
      const Tensor xbd = dev(xb), xfd = dev(xb.to_f32());
      for (const bool invariant : {false, true}) {
        const Exec& ex = invariant ? gpu_invariant() : gpu();
        Tensor a = Tensor::empty({M, s.N}, DType::kF32, Device::kCuda);
        Tensor b = Tensor::empty({M, s.N}, DType::kF32, Device::kCuda);
        linear_forward(ex, xbd, wd, a);
        linear_forward(ex, xfd, wd, b);
        const Tensor ha = host(a), hb = host(b);
        report(case_name(invariant ? "f32w_bf16x_bits_invariant" : "f32w_bf16x_bits", M, s.N, s.K,
                         0.0f),
               std::memcmp(ha.raw(), hb.raw(), ha.nbytes()) == 0 ? 0.0 : 1.0, 0.0);
      }
    }
  }
}

// A GEMV forked onto the side stream (kernels/side_stream.h) and joined: the caller's stream reads
// its result only after it is complete. The output starts as NaN and the GEMV is large (8192 x
// 8192 bf16, ~40 us) while the caller's stream copies the output at once after the join; the
// copy must equal a plain GEMV's bits. Forking twice without a join aborts.
TEST_F(GemmCuda, SideStreamBranchJoinsBeforeUse) {
  const int64_t N = 8192, K = 8192;
  const Tensor w = dev(to_bf16(randn({N, K}, 0.02f)));
  const Tensor x = dev(randn({1, K}));
  const Exec& ex = gpu();
  for (int round = 0; round < 3; ++round) {
    Tensor y = dev(Tensor::full({1, N}, std::nanf("")));
    Tensor copy = dev(Tensor::full({1, N}, std::nanf("")));
    const Exec side = fork_side_stream(ex);
    EXPECT_EQ(side.workspace, nullptr);
    EXPECT_NE(side.stream, ex.stream);
    linear_forward(side, x, w, y);
    join_side_stream(ex, side);
    copy_columns(ex, y, 0, copy);
    Tensor plain = Tensor::empty({1, N}, DType::kF32, Device::kCuda);
    linear_forward(ex, x, w, plain);
    const Tensor a = host(copy), b = host(plain);
    report("side_stream_join_round" + std::to_string(round),
           std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0 ? 0.0 : 1.0, 0.0);
  }
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        const Exec s1 = fork_side_stream(ex);
        const Exec s2 = fork_side_stream(ex);
        static_cast<void>(s1);
        static_cast<void>(s2);
      },
      "already forked");
}

// Programmatic dependent launch (kernels/cuda/pdl.h): in a recorded graph each GEMV's edge from
// its kernel predecessor becomes programmatic, so its blocks start (and prefetch weights) while
// the predecessor still runs; the wait must hold them until it is done. The first GEMV's x is the
// last row of a 1 GiB buffer that a grid-stride add writes in each block's last iterations, after
// its second wave of blocks has started (the launch-completion point); the second GEMV reads the
// first's output, reset to NaN before the add. A norm (a PDL-aware kernel without a prefetch)
// sits between the add and the first GEMV, so it, too, must wait for the add. Replays must give
// the eager run's bits. With LOOM_CUDA_PDL=0 the graph has no programmatic edges and the same
// must hold.
TEST_F(GemmCuda, PdlGemvsWaitForTheirProducers) {
  const int64_t R = 32768, K = 8192, N1 = 1000, N2 = 999;
  const Exec& ex = gpu();
  const Tensor big = Tensor::empty({R, K}, DType::kF32, Device::kCuda);
  const Tensor delta = Tensor::empty({R, K}, DType::kF32, Device::kCuda);
  zero_fill(ex, delta);
  const Tensor last = dev(randn({1, K}));
  copy_columns(ex, last, 0, delta.slice(0, R - 1, R));
  const Tensor w1 = dev(randn({N1, K}, 0.02f));            // f32 weights: gemv_rows
  const Tensor w2 = dev(to_bf16(randn({N2, N1}, 0.05f)));  // bf16 weights: gemv_bf16
  const Tensor nan_row = dev(Tensor::full({1, N1}, std::nanf("")));
  const Tensor y1 = Tensor::empty({1, N1}, DType::kF32, Device::kCuda);
  const Tensor y2 = Tensor::empty({1, N2}, DType::kF32, Device::kCuda);
  const Tensor norm_w = dev(randn({K}));
  const Tensor normed = Tensor::empty({1, K}, DType::kF32, Device::kCuda);
  auto step = [&] {
    zero_fill(ex, big);
    copy_columns(ex, nan_row, 0, y1);
    add_inplace(ex, big, delta);
    rmsnorm_forward(ex, big.slice(0, R - 1, R), norm_w, 1e-6f, 0.0f, normed);
    linear_forward(ex, normed, w1, y1);
    linear_forward(ex, y1, w2, y2);
  };
  step();
  const Tensor want1 = host(y1), want2 = host(y2);
  ASSERT_TRUE(std::isfinite(want2.data<float>()[0]));
  absl::StatusOr<DeviceGraph> graph = capture_graph(ex, step);
  ASSERT_TRUE(graph.ok()) << graph.status();
  const char* env = std::getenv("LOOM_CUDA_PDL");
  const bool pdl = env == nullptr || std::string(env) != "0";
  EXPECT_EQ(graph->programmatic_edges(), pdl ? 3u : 0u);  // the norm and both GEMVs
  for (int round = 0; round < 3; ++round) {
    graph->replay(ex);
    const Tensor got1 = host(y1), got2 = host(y2);
    report("pdl_norm_then_gemv_after_add_round" + std::to_string(round),
           std::memcmp(got1.raw(), want1.raw(), want1.nbytes()) == 0 ? 0.0 : 1.0, 0.0);
    report("pdl_gemv_after_gemv_round" + std::to_string(round),
           std::memcmp(got2.raw(), want2.raw(), want2.nbytes()) == 0 ? 0.0 : 1.0, 0.0);
  }
}

// bf16 x (bf16 activations), f32 or bf16 out: nothing is rounded on the way in, so every kernel
// is measured against the twin fed the same bf16 values.
TEST_F(GemmCuda, Bf16Activations) {
  for (const Shape2 s : kShapes) {
    for (int64_t M : kRows) {
      for (float beta : {0.0f, 1.0f}) {
        const Tensor xb = to_bf16(randn({M, s.K})), w = to_bf16(randn({s.N, s.K}));
        const Tensor out0 = rounded(randn({M, s.N}));  // representable in either output type
        const Reference ref = cpu_reference(xb.to_f32(), w, out0, beta);
        const Tensor xd = dev(xb), wd = dev(w);
        for (const DType ot : {DType::kF32, DType::kBF16}) {
          Tensor od = device_out(out0, beta, ot);
          linear_forward(gpu(), xd, wd, od, beta);
          const std::string what = ot == DType::kF32 ? "bf16x_f32out" : "bf16x_bf16out";
          const double err = ot == DType::kF32 ? cond_err(od, ref) : bf16_out_err(od, ref);
          report(case_name(what, M, s.N, s.K, beta), err, ot == DType::kF32 ? kBf16KernelTol : 1.0);
          od = device_out(out0, beta, ot);
          linear_forward(gpu_invariant(), xd, wd, od, beta);
          const double err_inv = ot == DType::kF32 ? cond_err(od, ref) : bf16_out_err(od, ref);
          report(case_name(what + "_invariant", M, s.N, s.K, beta), err_inv,
                 ot == DType::kF32 ? kBf16KernelTol : 1.0);
        }
      }
    }
  }
}

// K = 0: out = beta * out exactly (beta = 0 writes zeros over the NaN poison), every kernel.
TEST_F(GemmCuda, Bf16WeightsEmptyK) {
  const int64_t M = 5, N = 7;
  const Tensor w0 = Tensor::empty({N, 0}, DType::kBF16, Device::kCuda);
  const Tensor x0 = Tensor::empty({M, 0}, DType::kF32, Device::kCuda);
  for (float beta : {0.0f, 0.5f}) {
    const Tensor out0 = randn({M, N});
    Tensor ref = out0.clone();
    for (int64_t i = 0; i < ref.numel(); ++i) ref.data<float>()[i] *= beta;
    for (auto kernel : {cuda::Bf16Gemm::kAuto, cuda::Bf16Gemm::kGemv, cuda::Bf16Gemm::kCublasLt,
                        cuda::Bf16Gemm::kTiled}) {
      Tensor od = device_out(out0, beta, DType::kF32);
      cuda::linear_forward_bf16(gpu(), x0, w0, od, beta, kernel);
      report("bf16w_K0_kernel" + std::to_string(static_cast<int>(kernel)) + "_b" +
                 std::to_string(beta).substr(0, 3),
             twin::scaled_err(host(od), ref), 0.0);
    }
  }
}

// With a workspace the bf16 copy of x comes from it (nothing allocated past its capacity) and the
// result is the same bits as without one.
TEST_F(GemmCuda, Bf16WeightsUseWorkspace) {
  const int64_t M = 130, N = 1000, K = 777;
  const Tensor x = dev(randn({M, K})), w = dev(to_bf16(randn({N, K})));
  Tensor a = device_out(randn({M, N}), 0.0f, DType::kF32);
  Tensor b = device_out(randn({M, N}), 0.0f, DType::kF32);
  linear_forward(gpu(), x, w, a, 0.0f);
  Workspace ws(Device::kCuda, size_t{1} << 20);
  const Exec ex = cuda::device_exec(0, &ws);
  linear_forward(ex, x, w, b, 0.0f);
  const Tensor ha = host(a), hb = host(b);
  const bool same = std::memcmp(ha.raw(), hb.raw(), ha.nbytes()) == 0;
  report("bf16w_workspace_same_bits", same ? 0.0 : 1.0, 0.0);
  report("bf16w_workspace_used_bytes", ws.high_water() > 0 ? 0.0 : 1.0, 0.0);
  report("bf16w_workspace_overflows", static_cast<double>(ws.overflow_allocations()), 0.0);
}

// ---------------------------------------------------------------------------------------------
// Batch invariance: in batch-invariant mode each output row is bit-identical whether its input
// row is computed alone (M = 1) or at some position of a batch of 7, 64 or 300 other rows
// (which take all three tile configurations of both kernels). The error printed is the number
// of rows that differ in any bit from the row computed in the full batch.

// Rows `rows` of a host [R, C] tensor, in that order.
Tensor gather_rows(const Tensor& t, const std::vector<int64_t>& rows) {
  const int64_t C = t.dim(1);
  Tensor g = Tensor::empty({static_cast<int64_t>(rows.size()), C}, t.dtype());
  const size_t row_bytes = static_cast<size_t>(C) * dtype_size(t.dtype());
  for (size_t i = 0; i < rows.size(); ++i) {
    std::memcpy(static_cast<char*>(g.raw()) + i * row_bytes,
                static_cast<const char*>(t.raw()) + rows[i] * row_bytes, row_bytes);
  }
  return g;
}
Tensor transpose(const Tensor& t) {
  Tensor r = Tensor::empty({t.dim(1), t.dim(0)});
  for (int64_t i = 0; i < t.dim(0); ++i) {
    for (int64_t j = 0; j < t.dim(1); ++j) {
      r.data<float>()[j * t.dim(0) + i] = t.data<float>()[i * t.dim(1) + j];
    }
  }
  return r;
}

// `compute(x_rows)`: the GPU result (host, [rows, N]) for a host x of those rows.
template <typename Fn>
void check_invariance(const std::string& name, const Tensor& x, Fn&& compute) {
  const int64_t total = x.dim(0);
  std::vector<int64_t> all(total);
  for (int64_t i = 0; i < total; ++i) all[i] = i;
  const Tensor full = compute(x);
  const size_t row_bytes = static_cast<size_t>(full.dim(1)) * dtype_size(full.dtype());
  int64_t differing = 0;
  for (int64_t M : {1, 7, 64, 300}) {
    if (M > total) continue;
    for (int trial = 0; trial < 3; ++trial) {
      // M distinct rows in random order; the row under test lands at a random position.
      std::vector<int64_t> rows = all;
      std::shuffle(rows.begin(), rows.end(), rng());
      rows.resize(M);
      const Tensor part = compute(gather_rows(x, rows));
      for (int64_t i = 0; i < M; ++i) {
        differing +=
            std::memcmp(static_cast<const char*>(part.raw()) + i * row_bytes,
                        static_cast<const char*>(full.raw()) + rows[i] * row_bytes, row_bytes) != 0;
      }
    }
  }
  report(name, static_cast<double>(differing), 0.0);
}

// Each row of the batch-invariant GEMMs alone and in batches of other rows, bit for bit.
void check_batch_invariance(int64_t total, std::initializer_list<Shape2> shapes, int64_t K,
                            int64_t N) {
  for (const Shape2 s : shapes) {
    const std::string shape = "_N" + std::to_string(s.N) + "_K" + std::to_string(s.K);
    const Tensor x = randn({total, s.K});
    const Tensor wf = randn({s.N, s.K});
    const Tensor wb = to_bf16(randn({s.N, s.K}));
    for (const Tensor* w : {&wf, &wb}) {
      const Tensor wd = dev(*w);
      const std::string what =
          w->dtype() == DType::kF32 ? "invariant_rows_f32w" : "invariant_rows_bf16w";
      check_invariance(what + shape, x, [&](const Tensor& xs) {
        Tensor od = device_out(Tensor::zeros({xs.dim(0), s.N}), 0.0f, DType::kF32);
        linear_forward(gpu_invariant(), dev(xs), wd, od, 0.0f);
        return host(od);
      });
    }
    // bf16 activations and a bf16 output.
    const Tensor xb = to_bf16(x), wbd = dev(wb);
    check_invariance("invariant_rows_bf16x_bf16out" + shape, xb, [&](const Tensor& xs) {
      Tensor od = device_out(Tensor::zeros({xs.dim(0), s.N}), 0.0f, DType::kBF16);
      linear_forward(gpu_invariant(), dev(xs), wbd, od, 0.0f);
      return host(od);
    });
  }
  // matmul with a transposed a: the rows of op(a) are columns of a.
  const Tensor a = randn({total, K}), b = randn({K, N});
  const Tensor bd = dev(b);
  for (bool ta : {false, true}) {
    check_invariance(
        std::string("invariant_rows_matmul_") + (ta ? "T" : "N") + "N", a, [&](const Tensor& as) {
          Tensor od = device_out(Tensor::zeros({as.dim(0), N}), 0.0f, DType::kF32);
          matmul(gpu_invariant(), dev(ta ? transpose(as) : as), ta, bd, false, od, 0.75f, 0.0f);
          return host(od);
        });
  }
}

TEST_F(GemmCuda, BatchInvariance) {
  check_batch_invariance(300, {Shape2{1000, 777}, Shape2{256, 4096}}, 333, 129);
}

// The same kernels at sizes compute-sanitizer's racecheck finishes (tests/gpu/sanitize.sh).
TEST_F(GemmCuda, RacecheckBatchInvariance) {
  check_batch_invariance(70, {Shape2{130, 77}, Shape2{64, 300}}, 45, 33);
}

}  // namespace
}  // namespace loom
