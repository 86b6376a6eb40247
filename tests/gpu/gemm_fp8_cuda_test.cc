// CUDA linear layers with stored FP8 weights (kernels/cuda/gemm_fp8.h) against double-precision
// oracles on the dequantized matrix (w = f32(q) * scale_inv, the CPU reference's definition) and
// the CPU twin. Fresh random inputs every run (the seed is printed; LOOM_GPU_TEST_SEED replays
// one); weights with per-block magnitudes 2^U(-3, 3) so every block has its own scale; shapes with
// partial edge blocks ([576, 7168] like DeepSeek-V3's kv_a_proj_with_mqa, scales [5, 56]; K = 333,
// 400 and 272, N = 77, 136 and 1000); outputs poisoned with NaN before every beta = 0 run. Only
// some rows of a large M are checked against the double oracle (all rows of M <= 64). Prints
// "GPUCHECK <name> <error> <tolerance> <PASS|FAIL>" lines for tests/gpu/run.sh.
//
// Bounds, per output element, with cond = sum_c |w_c x_c| (+ |beta out0|):
//  - The GEMV (decode rows, every row in batch-invariant mode) dequantizes exactly as the
//    reference and uses x as it is, so it differs from the exact product of the dequantized matrix
//    only by f32 summation: |gpu - ref| <= kGemmTol cond (16 eps, tests/gpu/twin_tolerances.h).
//  - The block-scaled path quantizes x per token and group g of 128 columns: s_g = amax_g / 448,
//    xq_c = s_g e4m3(x_c / s_g). e4m3 keeps 3 fraction bits, so a normal value rounds with relative
//    error <= 2^-4 and a subnormal one (|x / s| < 2^-6, spacing 2^-9) with absolute error <= 2^-10
//    in units of s; the f32 quotient adds 2^-24 relative. Hence
//        |xq_c - x_c| <= |x_c| 2^-4 (1 + 2^-20) + s_g 2^-10,
//    and against the unquantized reference
//        |gpu - ref| <= sum_c |w_c| (|x_c| 2^-4 (1 + 2^-20) + s_g(c) 2^-10) + kMmaTol cond_q
//    where the last term is the GEMM's own error on the quantized x (cond_q = sum_c |w_c xq_c|).
//    This worst-case bound is loose (random rounding errors cancel: rel L2 is ~3e-2), so the
//    GEMM is also checked tightly against the oracle fed the quantized x (computed here by the
//    CPU twin of the quantization, which must match the GPU's bit for bit):
//        |gpu - ref_q| <= kMmaTol cond_q, kMmaTol = 2^-10.
//    Why 2^-10: the FP8 tensor cores accumulate with about 14 significant bits (DeepSeek-V3
//    technical report, 3.3.2); cuBLASLt's block-scaled kernel promotes each 128-deep block's
//    partial sum to f32 (it must, to apply the block's scales), so each block's error is a few
//    2^-14 of that block's sum of |terms|, a few 2^-14 cond_q in all; 2^-10 leaves 16x. A scale
//    applied to the wrong 128-block, or a dropped block, is an error of ~1 / ceil(K / 128) of
//    cond_q in the worst rows (1.8e-2 at K = 7168), far above it.
//  - The dequantize-to-bf16 path rounds each dequantized weight to bf16 (relative 2^-8) and an f32
//    x too, then runs the bf16 tensor-core GEMM: |gpu - ref| <= (2^-8 + 2^-8 [f32 x] + 2^-16 +
//    64 eps) cond (64 eps: tensor-core summation, as tests/gpu/gemm_cuda_test.cc explains).
//  - kAuto (the public dispatch) runs the GEMV or the dequantize-to-bf16 path: that path's bound.
//  - bf16 output: add the output's rounding, 2^-8 |gpu|.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/fp8_matrix.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm_fp8.h"
#include "kernels/cuda/gemm_fp8_launch.h"
#include "kernels/gemm.h"
#include "tests/gpu/fp8_test_support.h"
#include "tests/gpu/gpu_test_support.h"
#include "tests/gpu/twin_tolerances.h"

namespace loom {
namespace {

constexpr double kMmaTol = 1.0 / 1024;
constexpr double kBf16OutUnit = 1.0 / 256;
constexpr double kE4m3Rel = (1.0 / 16) * (1.0 + 1.0 / (1 << 20));
constexpr double kE4m3SubnormalAbs = 1.0 / 1024;

std::mt19937_64& rng() {
  static std::mt19937_64 r(gpu_test_seed());
  return r;
}
const Exec& gpu() {
  static const Exec ex = cuda::device_exec(0);
  return ex;
}
Exec gpu_invariant() {
  Exec ex = gpu();
  ex.batch_invariant = true;
  return ex;
}

// Host activations [m, k]: N(0, 1) times a factor 2^U(-2, 2) per row and 128-column group (so the
// groups' scales differ); rounded to bf16 values when `bf16` (the f32 tensor then holds exactly
// what the GPU reads).
Tensor random_x(int64_t m, int64_t k, bool bf16) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(-2.0f, 2.0f);
  Tensor x = Tensor::empty({m, k});
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c0 = 0; c0 < k; c0 += kFp8BlockSize) {
      const float f = std::exp2(ud(rng()));
      for (int64_t c = c0; c < std::min(k, c0 + kFp8BlockSize); ++c) {
        float v = nd(rng()) * f;
        if (bf16) v = bf16_to_f32(f32_to_bf16(v));
        x.data<float>()[r * k + c] = v;
      }
    }
  }
  return x;
}
Tensor to_bf16(const Tensor& f32) {
  Tensor t = Tensor::empty(f32.shape(), DType::kBF16);
  for (int64_t i = 0; i < f32.numel(); ++i)
    t.data<uint16_t>()[i] = f32_to_bf16(f32.data<float>()[i]);
  return t;
}
Tensor upload(const Tensor& f32, bool bf16) { return cuda::to_device(bf16 ? to_bf16(f32) : f32); }

using fp8test::GroupQuant;
using fp8test::quantize_groups;

// The rows of an m-row output checked against the double oracle: all of them up to 64, else the
// first, the last four, the middle and 12 random ones.
std::vector<int64_t> checked_rows(int64_t m) {
  std::vector<int64_t> rows;
  if (m <= 64) {
    for (int64_t r = 0; r < m; ++r) rows.push_back(r);
    return rows;
  }
  rows = {0, m / 2, m - 4, m - 3, m - 2, m - 1};
  std::uniform_int_distribution<int64_t> ud(0, m - 1);
  for (int i = 0; i < 12; ++i) rows.push_back(ud(rng()));
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

// The double-precision oracle of the checked rows: for element (row i of `rows`, column j),
// ref = sum_c w_c x_c + beta out0, cond = sum |w_c x_c| + |beta out0|, the same against the
// quantized x (ref_q, cond_q), and the activation-quantization bound qbound (top of the file).
struct Oracle {
  std::vector<int64_t> rows;
  std::vector<double> ref, cond, ref_q, cond_q, qbound;
};
Oracle oracle(const Tensor& wd, const Tensor& x, const GroupQuant& gq, const Tensor& out0,
              float beta, std::vector<int64_t> rows) {
  const int64_t n = wd.dim(0), k = wd.dim(1), m = x.dim(0);
  Oracle o;
  o.rows = std::move(rows);
  const size_t size = o.rows.size() * n;
  for (auto* v : {&o.ref, &o.cond, &o.ref_q, &o.cond_q, &o.qbound}) v->assign(size, 0.0);
  for (size_t i = 0; i < o.rows.size(); ++i) {
    const int64_t r = o.rows[i];
    const float* xr = x.data<float>() + r * k;
    const float* xqr = gq.xq.data<float>() + r * k;
    for (int64_t j = 0; j < n; ++j) {
      const float* wr = wd.data<float>() + j * k;
      double ref = 0, cond = 0, ref_q = 0, cond_q = 0, qb = 0;
      for (int64_t c = 0; c < k; ++c) {
        const double w = wr[c], xv = xr[c], xq = xqr[c];
        const double s = gq.s[(c / kFp8BlockSize) * m + r];
        ref += w * xv;
        cond += std::fabs(w * xv);
        ref_q += w * xq;
        cond_q += std::fabs(w * xq);
        qb += std::fabs(w) * (std::fabs(xv) * kE4m3Rel + s * kE4m3SubnormalAbs);
      }
      const double b = static_cast<double>(beta) * out0.data<float>()[r * n + j];
      const size_t e = i * n + j;
      o.ref[e] = ref + b;
      o.cond[e] = cond + std::fabs(b);
      o.ref_q[e] = ref_q + b;
      o.cond_q[e] = cond_q + std::fabs(b);
      o.qbound[e] = qb;
    }
  }
  return o;
}

// The largest |got - ref| / tol over the checked elements (infinite for a non-finite result),
// with tol = tol_of(element) (+ 2^-8 |got| for a bf16 output).
template <typename TolOf>
double worst_ratio(const Tensor& got, const Oracle& o, const std::vector<double>& ref, bool bf16,
                   TolOf tol_of) {
  const int64_t n = got.dim(1);
  double worst = 0.0;
  for (size_t i = 0; i < o.rows.size(); ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const size_t e = i * n + j;
      const double g = got.data<float>()[o.rows[i] * n + j];
      if (!std::isfinite(g)) return INFINITY;
      const double tol = tol_of(e) + (bf16 ? kBf16OutUnit * std::fabs(g) : 0.0) + 1e-300;
      worst = std::max(worst, std::fabs(g - ref[e]) / tol);
    }
  }
  return worst;
}
double rel_l2(const Tensor& got, const Oracle& o, const std::vector<double>& ref) {
  const int64_t n = got.dim(1);
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < o.rows.size(); ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const double d = got.data<float>()[o.rows[i] * n + j] - ref[i * n + j];
      num += d * d;
      den += ref[i * n + j] * ref[i * n + j];
    }
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

void report(const std::string& name, double err, double tol) {
  const bool pass = err <= tol;  // false for NaN
  std::printf("GPUCHECK %s %.3e %.3e %s\n", name.c_str(), err, tol, pass ? "PASS" : "FAIL");
  std::fflush(stdout);
  EXPECT_LE(err, tol) << name;
}

// One problem: a weight, activations, a start output, and its oracle.
struct Problem {
  int64_t m, n, k;
  bool x_bf16, out_bf16;
  float beta;
  Tensor wq, wd, w_dev, x, x_dev, out0;
  GroupQuant gq;
  Oracle o;
  std::string name;
};
Problem make_problem(const Tensor& wq, const Tensor& wd, const Tensor& w_dev, int64_t m,
                     bool x_bf16, bool out_bf16, float beta, const std::string& tag) {
  Problem p{m, wq.dim(0), wq.dim(1), x_bf16, out_bf16, beta, wq, wd, w_dev};
  p.x = random_x(m, p.k, x_bf16);
  p.x_dev = upload(p.x, x_bf16);
  p.out0 = random_x(m, p.n, true);  // bf16 values: representable in either output dtype
  p.gq = quantize_groups(p.x);
  p.o = oracle(wd, p.x, p.gq, p.out0, beta, checked_rows(m));
  p.name = tag + "_M" + std::to_string(m) + "_N" + std::to_string(p.n) + "_K" +
           std::to_string(p.k) + (x_bf16 ? "_xbf16" : "_xf32") + (out_bf16 ? "_obf16" : "_of32") +
           (beta != 0.0f ? "_beta" : "");
  return p;
}
// A device output: NaN everywhere (beta = 0) or out0, in the output dtype.
Tensor device_out(const Problem& p) {
  const Tensor h = p.beta == 0.0f ? Tensor::full(p.out0.shape(), std::nanf("")) : p.out0;
  return upload(h, p.out_bf16);
}
Tensor result(const Tensor& out_dev) { return cuda::to_host(out_dev).to_f32(); }

struct Weight {
  Tensor wq, wd, dev;
};
Weight make_weight(int64_t n, int64_t k) {
  Weight w;
  w.wq = fp8test::random_fp8_matrix(rng(), n, k);
  w.wd = fp8test::dequantized(w.wq);
  w.dev = fp8test::fp8_to_device(w.wq);
  return w;
}

TEST(GemmFp8Cuda, ActivationQuantizationMatchesCpuTwin) {
  for (const auto& [m, k] :
       std::vector<std::pair<int64_t, int64_t>>{{5, 7168}, {3, 333}, {4, 400}}) {
    for (const bool bf16 : {false, true}) {
      Tensor x = random_x(m, k, bf16);
      // Awkward groups: an all-zero one (scale 1), one of tiny values (e4m3 subnormals after
      // scaling by a large amax), one with a huge value.
      for (int64_t c = 0; c < std::min<int64_t>(k, 128); ++c) x.data<float>()[c] = 0.0f;
      if (m > 1 && k > 130) {
        x.data<float>()[k + 130] = 10240.0f;  // a bf16 value
        for (int64_t c = 131; c < std::min<int64_t>(k, 256); ++c)
          x.data<float>()[k + c] = bf16_to_f32(f32_to_bf16(0.05f * (c % 7 - 3)));
      }
      const GroupQuant want = quantize_groups(x);
      const int64_t groups = (k + kFp8BlockSize - 1) / kFp8BlockSize;
      const Tensor x_dev = upload(x, bf16);
      Tensor q_dev = Tensor::empty({m, k}, DType::kU8, Device::kCuda);
      Tensor s_dev = Tensor::empty({groups, m}, DType::kF32, Device::kCuda);
      cuda::launch::quantize_fp8_groups(cuda::stream_of(gpu()), x_dev.raw(),
                                        bf16 ? cuda::launch::Elem::kBF16 : cuda::launch::Elem::kF32,
                                        m, k, static_cast<uint8_t*>(q_dev.raw()),
                                        s_dev.data<float>());
      const Tensor q = cuda::to_host(q_dev), s = cuda::to_host(s_dev);
      int64_t bad_q = 0, bad_s = 0;
      for (int64_t i = 0; i < m * k; ++i)
        bad_q += static_cast<const uint8_t*>(q.raw())[i] != want.q[i];
      for (int64_t i = 0; i < groups * m; ++i)
        bad_s += std::memcmp(s.data<float>() + i, &want.s[i], 4) != 0;
      const std::string name = "fp8_act_quant_M" + std::to_string(m) + "_K" + std::to_string(k) +
                               (bf16 ? "_xbf16" : "_xf32");
      report(name + "_codes_differing", static_cast<double>(bad_q), 0.0);
      report(name + "_scales_differing", static_cast<double>(bad_s), 0.0);
    }
  }
}

TEST(GemmFp8Cuda, GemvMatchesDequantizedReference) {
  struct Shape2 {
    int64_t n, k;
    std::vector<int64_t> ms;
  };
  const std::vector<Shape2> shapes = {
      {576, 7168, {1, 7, 64}}, {200, 333, {1, 7, 64, 300}}, {77, 160, {1, 7}}, {136, 400, {3, 8}}};
  int variant = 0;
  for (const Shape2& s : shapes) {
    const Weight w = make_weight(s.n, s.k);
    for (const int64_t m : s.ms) {
      const bool x_bf16 = variant % 2 == 1, out_bf16 = variant % 3 == 2;
      const float beta = variant % 4 == 3 ? 0.5f : 0.0f;
      ++variant;
      const Problem p = make_problem(w.wq, w.wd, w.dev, m, x_bf16, out_bf16, beta, "fp8_gemv");
      const Tensor out = device_out(p);
      ASSERT_TRUE(cuda::linear_forward_fp8(gpu(), p.x_dev, w.dev, out, beta, cuda::Fp8Gemm::kGemv));
      const Tensor got = result(out);
      report(p.name,
             worst_ratio(got, p.o, p.o.ref, out_bf16,
                         [&](size_t e) { return twin::kGemmTol * p.o.cond[e]; }),
             1.0);
      // The CPU twin (loom::linear_forward on the host FP8 matrix) on the same rows, f32 output:
      // both within kGemmTol of the exact product, so within 2 kGemmTol of each other.
      if (!out_bf16 && m <= 64) {
        Tensor cpu = p.out0.clone();
        linear_forward(host_exec(), p.x, w.wq, cpu, beta);
        double err = 0.0;
        for (size_t i = 0; i < p.o.rows.size(); ++i) {
          for (int64_t j = 0; j < p.n; ++j) {
            const int64_t e = p.o.rows[i] * p.n + j;
            err = std::max(err, std::fabs(got.data<float>()[e] - cpu.data<float>()[e]) /
                                    (p.o.cond[i * p.n + j] + 1e-300));
          }
        }
        report(p.name + "_vs_cpu_twin_cond", std::isfinite(err) ? err : INFINITY,
               2 * twin::kGemmTol);
      }
    }
  }
}

TEST(GemmFp8Cuda, BlockScaledMatchesQuantizedActivations) {
  struct Shape2 {
    int64_t n, k;
    std::vector<int64_t> ms;
  };
  // Shapes cuBLASLt takes (k % 16 == 0, 16-byte output rows): partial blocks in N (576, 1000,
  // 136), in K (400: 3 whole blocks and 16 columns) and a scale grid of 3 columns (K = 272, padded
  // to 4 for cuBLASLt).
  const std::vector<Shape2> shapes = {
      {576, 7168, {64, 300, 2048}}, {1000, 1024, {300}}, {136, 400, {64, 300}}, {256, 272, {300}}};
  int variant = 0;
  for (const Shape2& s : shapes) {
    const Weight w = make_weight(s.n, s.k);
    for (const int64_t m : s.ms) {
      const bool x_bf16 = variant % 2 == 0, out_bf16 = variant % 3 == 1;
      const float beta = variant % 4 == 2 ? 0.5f : 0.0f;
      ++variant;
      const Problem p =
          make_problem(w.wq, w.wd, w.dev, m, x_bf16, out_bf16, beta, "fp8_blockscaled");
      const Tensor out = device_out(p);
      const bool ran =
          cuda::linear_forward_fp8(gpu(), p.x_dev, w.dev, out, beta, cuda::Fp8Gemm::kBlockScaled);
      EXPECT_TRUE(ran) << p.name << ": cuBLASLt refused a shape it should take";
      if (!ran) continue;
      const Tensor got = result(out);
      report(p.name + "_vs_quantized_x",
             worst_ratio(got, p.o, p.o.ref_q, out_bf16,
                         [&](size_t e) { return kMmaTol * p.o.cond_q[e]; }),
             1.0);
      report(p.name + "_vs_exact_derived_bound",
             worst_ratio(got, p.o, p.o.ref, out_bf16,
                         [&](size_t e) { return p.o.qbound[e] + kMmaTol * p.o.cond_q[e]; }),
             1.0);
      std::printf("GPUINFO %s rel_l2 vs exact %.3e, vs quantized x %.3e\n", p.name.c_str(),
                  rel_l2(got, p.o, p.o.ref), rel_l2(got, p.o, p.o.ref_q));
    }
  }
  // What it refuses, leaving out untouched: rows not a multiple of 4, k % 16 != 0, unaligned
  // output rows.
  for (const auto& [n, k, m] :
       std::vector<std::array<int64_t, 3>>{{576, 7168, 7}, {200, 333, 64}, {77, 160, 64}}) {
    const Weight w = make_weight(n, k);
    const Problem p = make_problem(w.wq, w.wd, w.dev, m, false, false, 0.0f, "fp8_blockscaled");
    const Tensor out = device_out(p);
    EXPECT_FALSE(
        cuda::linear_forward_fp8(gpu(), p.x_dev, w.dev, out, 0.0f, cuda::Fp8Gemm::kBlockScaled))
        << p.name;
  }
}

TEST(GemmFp8Cuda, DequantBf16MeetsBf16RoundingBound) {
  struct Shape2 {
    int64_t n, k;
    std::vector<int64_t> ms;
  };
  // K = 333: the scalar dequantization and unaligned bf16 rows (Loom's tensor-core kernel instead
  // of cuBLASLt); N = 77: odd output rows.
  const std::vector<Shape2> shapes = {
      {576, 7168, {64, 300}}, {1000, 1024, {2048}}, {200, 333, {300}}, {77, 160, {64}}};
  int variant = 0;
  for (const Shape2& s : shapes) {
    const Weight w = make_weight(s.n, s.k);
    for (const int64_t m : s.ms) {
      const bool x_bf16 = variant % 2 == 0, out_bf16 = variant % 3 == 1;
      const float beta = variant % 4 == 3 ? 0.5f : 0.0f;
      ++variant;
      const Problem p =
          make_problem(w.wq, w.wd, w.dev, m, x_bf16, out_bf16, beta, "fp8_dequantbf16");
      const Tensor out = device_out(p);
      ASSERT_TRUE(
          cuda::linear_forward_fp8(gpu(), p.x_dev, w.dev, out, beta, cuda::Fp8Gemm::kDequantBf16));
      const Tensor got = result(out);
      const double unit =
          kBf16OutUnit + (x_bf16 ? 0.0 : kBf16OutUnit) + 1.0 / 65536 + 64 * twin::kEps;
      report(p.name,
             worst_ratio(got, p.o, p.o.ref, out_bf16, [&](size_t e) { return unit * p.o.cond[e]; }),
             1.0);
      std::printf("GPUINFO %s rel_l2 vs exact %.3e\n", p.name.c_str(), rel_l2(got, p.o, p.o.ref));
    }
  }
}

// kAuto is W8A16 (kernels/cuda/gemm_fp8.h): the GEMV up to 8 rows, the dequantize-to-bf16 path
// beyond, so every row count meets the dequantize-to-bf16 bound (the GEMV's is far below it).
TEST(GemmFp8Cuda, AutoMeetsW8A16Bound) {
  struct Shape2 {
    int64_t n, k;
    std::vector<int64_t> ms;
  };
  // Through the public dispatch (loom::linear_forward): M = 1 and 7 on the GEMV, the rest on the
  // bf16 copy (K = 333 and N = 77: Loom's tensor-core kernel instead of cuBLASLt).
  const std::vector<Shape2> shapes = {{576, 7168, {1, 7, 64, 300, 301, 2048}},
                                      {1000, 1024, {300, 2048}},
                                      {136, 400, {64, 301}},
                                      {256, 272, {64}},
                                      {200, 333, {300}},
                                      {77, 160, {64}}};
  int variant = 0;
  for (const Shape2& s : shapes) {
    const Weight w = make_weight(s.n, s.k);
    for (const int64_t m : s.ms) {
      const bool x_bf16 = variant % 2 == 1, out_bf16 = x_bf16 && variant % 4 == 1;
      const float beta = variant % 3 == 2 ? 1.0f : 0.0f;
      ++variant;
      const Problem p = make_problem(w.wq, w.wd, w.dev, m, x_bf16, out_bf16, beta, "fp8_auto");
      const Tensor out = device_out(p);
      linear_forward(gpu(), p.x_dev, w.dev, out, beta);
      const Tensor got = result(out);
      const double unit =
          kBf16OutUnit + (x_bf16 ? 0.0 : kBf16OutUnit) + 1.0 / 65536 + 64 * twin::kEps;
      report(p.name,
             worst_ratio(got, p.o, p.o.ref, out_bf16, [&](size_t e) { return unit * p.o.cond[e]; }),
             1.0);
      std::printf("GPUINFO %s rel_l2 vs exact %.3e\n", p.name.c_str(), rel_l2(got, p.o, p.o.ref));
    }
  }
}

TEST(GemmFp8Cuda, BatchInvariantRowsAreBitIdentical) {
  // In batch-invariant mode every row runs through the GEMV, whose rows do not depend on m.
  const Weight w = make_weight(576, 7168);
  const int64_t m = 300;
  const Tensor x = random_x(m, 7168, true);
  const Tensor x_dev = upload(x, true);
  Tensor all = Tensor::empty({m, 576}, DType::kBF16, Device::kCuda);
  linear_forward(gpu_invariant(), x_dev, w.dev, all, 0.0f);
  const Tensor all_h = cuda::to_host(all);
  int64_t differing = 0;
  for (const int64_t r : {int64_t{0}, int64_t{5}, int64_t{150}, m - 1}) {
    const Tensor one_x = upload(x.slice(0, r, r + 1).clone(), true);
    Tensor one = Tensor::empty({1, 576}, DType::kBF16, Device::kCuda);
    linear_forward(gpu_invariant(), one_x, w.dev, one, 0.0f);
    const Tensor one_h = cuda::to_host(one);
    differing +=
        std::memcmp(one_h.raw(), static_cast<const uint16_t*>(all_h.raw()) + r * 576, 576 * 2) != 0;
  }
  report("fp8_invariant_rows_differing_M300_N576_K7168", static_cast<double>(differing), 0.0);
}

}  // namespace
}  // namespace loom
