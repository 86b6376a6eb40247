// linear_forward / matmul against double-precision references; bf16 weights against f32 weights
// of the same values.
#include "kernels/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/gemm.h"

namespace loom {
namespace {

Tensor random_tensor(Shape shape, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = Tensor::empty(shape);
  std::uniform_real_distribution<float> dist(lo, hi);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
  return t;
}

// Reference: out[m, n] = alpha * sum_k A(m, k) B(k, n) + beta * out0[m, n] in double.
std::vector<double> ref_matmul(const Tensor& a, bool ta, const Tensor& b, bool tb,
                               const std::vector<float>& out0, int64_t m, int64_t n, int64_t k,
                               double alpha, double beta) {
  std::vector<double> r(m * n);
  const float* ap = a.data<float>();
  const float* bp = b.data<float>();
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int64_t l = 0; l < k; ++l) {
        const double av = ta ? ap[l * m + i] : ap[i * k + l];
        const double bv = tb ? bp[j * k + l] : bp[l * n + j];
        s += av * bv;
      }
      r[i * n + j] = alpha * s + (beta != 0.0 ? beta * out0[i * n + j] : 0.0);
    }
  }
  return r;
}

// f32 accumulation of K products of magnitude <= 1: the error grows at worst like K * eps and
// typically like sqrt(K) * eps; 4 * K * eps (~6e-5 at K = 129) bounds it with margin.
double tol_for(int64_t k) { return 4.0 * static_cast<double>(k) * 1.2e-7 + 1e-6; }

TEST(Gemm, LinearForwardOddSizes) {
  std::mt19937 rng(1234);
  const int64_t m = 37, k = 129, n = 71;
  Tensor x = random_tensor({m, k}, rng), w = random_tensor({n, k}, rng);
  Tensor out = Tensor::full({m, n}, std::numeric_limits<float>::quiet_NaN());  // beta 0: ignored
  linear_forward(host_exec(), x, w, out);
  Tensor wt = w;  // reference uses b = w with trans_b
  auto ref = ref_matmul(x, false, wt, true, {}, m, n, k, 1.0, 0.0);
  double max_err = 0.0;
  for (int64_t i = 0; i < m * n; ++i) {
    max_err = std::max(max_err, std::abs(out.data<float>()[i] - ref[i]));
  }
  EXPECT_LT(max_err, tol_for(k));
  std::printf("linear_forward max abs err %.3g\n", max_err);
}

TEST(Gemm, LinearForwardAccumulatesAndLeadingDims) {
  std::mt19937 rng(99);
  const int64_t b = 3, s = 5, k = 65, n = 33;  // x [3, 5, 65]: leading dims flattened to M = 15
  Tensor x = random_tensor({b, s, k}, rng), w = random_tensor({n, k}, rng);
  Tensor out = random_tensor({b, s, n}, rng);
  std::vector<float> out0(out.data<float>(), out.data<float>() + out.numel());
  linear_forward(host_exec(), x, w, out, 1.0f);
  auto ref = ref_matmul(x, false, w, true, out0, b * s, n, k, 1.0, 1.0);
  for (int64_t i = 0; i < b * s * n; ++i) {
    ASSERT_NEAR(out.data<float>()[i], ref[i], tol_for(k)) << i;
  }
}

TEST(Gemm, EmptyM) {
  std::mt19937 rng(5);
  Tensor x = Tensor::empty({0, 16}), w = random_tensor({8, 16}, rng), out = Tensor::empty({0, 8});
  linear_forward(host_exec(), x, w, out);  // no-op, must not crash
  SUCCEED();
}

TEST(Gemm, MatmulAllTransposes) {
  std::mt19937 rng(7);
  const int64_t m = 37, k = 129, n = 71;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      Tensor a = ta ? random_tensor({k, m}, rng) : random_tensor({m, k}, rng);
      Tensor b = tb ? random_tensor({n, k}, rng) : random_tensor({k, n}, rng);
      Tensor out = random_tensor({m, n}, rng);
      std::vector<float> out0(out.data<float>(), out.data<float>() + out.numel());
      matmul(host_exec(), a, ta, b, tb, out, 0.75f, 0.5f);
      auto ref = ref_matmul(a, ta, b, tb, out0, m, n, k, 0.75, 0.5);
      for (int64_t i = 0; i < m * n; ++i) {
        ASSERT_NEAR(out.data<float>()[i], ref[i], tol_for(k)) << "ta " << ta << " tb " << tb;
      }
    }
  }
}

TEST(Gemm, SingleRowAllTransposes) {  // the M = 1 (GEMV) path, with garbage out for beta 0
  std::mt19937 rng(17);
  const int64_t m = 1, k = 129, n = 71;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      for (float beta : {0.0f, 0.5f}) {
        Tensor a = ta ? random_tensor({k, m}, rng) : random_tensor({m, k}, rng);
        Tensor b = tb ? random_tensor({n, k}, rng) : random_tensor({k, n}, rng);
        Tensor out = beta == 0.0f ? Tensor::full({m, n}, std::numeric_limits<float>::quiet_NaN())
                                  : random_tensor({m, n}, rng);
        std::vector<float> out0(out.data<float>(), out.data<float>() + out.numel());
        matmul(host_exec(), a, ta, b, tb, out, 1.25f, beta);
        auto ref = ref_matmul(a, ta, b, tb, out0, m, n, k, 1.25, beta);
        for (int64_t i = 0; i < m * n; ++i) {
          ASSERT_NEAR(out.data<float>()[i], ref[i], tol_for(k)) << ta << tb << beta;
        }
      }
    }
  }
}

TEST(Gemm, FewRowsAllTransposesAndStrides) {
  // 2..9 rows (the few-row kernel up to 8, OpenBLAS beyond) for both layouts of b, with sizes
  // that are not multiples of any vector width or block, leading dimensions wider than the
  // rows, alpha/beta variants, and NaN in c where beta = 0 must not read it.
  std::mt19937 rng(23);
  for (int64_t m = 2; m <= 9; ++m) {
    for (int64_t n : {1, 7, 300, 1031}) {
      const int64_t k = 67 + 13 * m;
      for (int tb = 0; tb < 2; ++tb) {
        for (float beta : {0.0f, -0.75f}) {
          const int64_t lda = k + 3, ldb = (tb ? k : n) + 5, ldc = n + 2;
          std::vector<float> a(m * lda), b((tb ? n : k) * ldb), c(m * ldc);
          std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
          for (float& v : a) v = dist(rng);
          for (float& v : b) v = dist(rng);
          for (float& v : c) v = beta == 0.0f ? std::numeric_limits<float>::quiet_NaN() : dist(rng);
          const std::vector<float> c0 = c;
          cpu::sgemm(false, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < n; ++j) {
              double s = 0.0;
              for (int64_t l = 0; l < k; ++l) {
                s += static_cast<double>(a[i * lda + l]) * (tb ? b[j * ldb + l] : b[l * ldb + j]);
              }
              const double ref = 0.5 * s + (beta != 0.0f ? beta * c0[i * ldc + j] : 0.0);
              ASSERT_NEAR(c[i * ldc + j], ref, tol_for(k))
                  << "m " << m << " n " << n << " tb " << tb << " beta " << beta;
            }
            for (int64_t j = n; j < ldc; ++j) {  // padding between rows untouched
              ASSERT_TRUE(std::isnan(c[i * ldc + j]) || c[i * ldc + j] == c0[i * ldc + j]);
            }
          }
        }
      }
    }
  }
}

TEST(Gemm, ZeroInnerDimensionScalesByBeta) {
  Tensor a = Tensor::empty({3, 0}), b = Tensor::empty({0, 4});
  Tensor out = Tensor::full({3, 4}, 2.0f);
  matmul(host_exec(), a, false, b, false, out, 1.0f, 0.5f);
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(out.data<float>()[i], 1.0f);
  Tensor out2 = Tensor::full({3, 4}, std::numeric_limits<float>::quiet_NaN());
  matmul(host_exec(), a, false, b, false, out2, 1.0f, 0.0f);
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(out2.data<float>()[i], 0.0f);
}

// Batch-invariant mode: row i of an m-row product is bit-identical to the same row computed alone
// (or at any other place in any other batch), for both layouts of b, beta 0 and 1, row counts on
// both sides of the few-row and row-block thresholds, and k, n not multiples of the vector width;
// and the numbers stay within the f32 bound of the double reference.
TEST(Gemm, BatchInvariantRowsBitIdentical) {
  const cpu::RowInvariantScope mode(true);
  std::mt19937 rng(20261130);
  for (bool tb : {true, false}) {
    for (float beta : {0.0f, 1.0f}) {
      const int64_t k = 131, n = 77;
      const int64_t rows = 150;
      Tensor a = random_tensor({rows, k}, rng);
      Tensor b = tb ? random_tensor({n, k}, rng) : random_tensor({k, n}, rng);
      Tensor c0 = random_tensor({rows, n}, rng);
      // Each row alone (m = 1).
      std::vector<float> alone(rows * n);
      for (int64_t i = 0; i < rows; ++i) {
        std::vector<float> c(c0.data<float>() + i * n, c0.data<float>() + (i + 1) * n);
        cpu::sgemm(false, tb, 1, n, k, 1.0f, a.data<float>() + i * k, k, b.data<float>(),
                   tb ? k : n, beta, c.data(), n);
        std::copy(c.begin(), c.end(), alone.begin() + i * n);
      }
      std::vector<float> out0(c0.data<float>(), c0.data<float>() + rows * n);
      auto ref = ref_matmul(a, false, b, tb, out0, rows, n, k, 1.0, beta);
      double max_err = 0.0;
      for (int64_t i = 0; i < rows * n; ++i)
        max_err = std::max(max_err, std::abs(alone[i] - ref[i]));
      EXPECT_LT(max_err, tol_for(k) + (beta != 0.0f ? 1e-6 : 0.0));
      // Then every window [first, first + m) of the rows as one product.
      for (int64_t m : {2, 3, 5, 8, 9, 13, 64, 65, 71, 149}) {
        const int64_t first = std::uniform_int_distribution<int64_t>(0, rows - m)(rng);
        std::vector<float> c(c0.data<float>() + first * n, c0.data<float>() + (first + m) * n);
        cpu::sgemm(false, tb, m, n, k, 1.0f, a.data<float>() + first * k, k, b.data<float>(),
                   tb ? k : n, beta, c.data(), n);
        int64_t differ = 0;
        for (int64_t i = 0; i < m * n; ++i) differ += c[i] != alone[first * n + i];
        EXPECT_EQ(differ, 0) << "m=" << m << " first=" << first << " trans_b=" << tb
                             << " beta=" << beta;
      }
    }
  }
}

// A weight matrix of bf16-representable values, as bf16 and as f32 (the same numbers).
struct Bf16Weight {
  Tensor bf16, f32;
};
Bf16Weight random_bf16_weight(Shape shape, std::mt19937& rng) {
  Bf16Weight w{Tensor::empty(shape, DType::kBF16), Tensor::empty(shape)};
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int64_t i = 0; i < w.f32.numel(); ++i) {
    const uint16_t b = f32_to_bf16(dist(rng));
    w.bf16.data<uint16_t>()[i] = b;
    w.f32.data<float>()[i] = bf16_to_f32(b);
  }
  return w;
}

int64_t count_differing(const Tensor& a, const Tensor& b) {
  int64_t n = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    n += std::memcmp(a.data<float>() + i, b.data<float>() + i, sizeof(float)) != 0;
  return n;
}

// bf16 weights with f32 activations: the product of the f32 weight holding the same values. Row
// counts cover the GEMV row, the few-row kernel (<= 8, bit-identical to the f32 weight: the same
// kernel widening in registers) and OpenBLAS on widened panels (more rows); odd n and k leave
// vector tails. Both are checked against the double reference with the f32 bound, and against
// each other: with f32 accumulation of the same values they may differ only by the rounding of
// differently blocked sums (the bound of one f32 GEMM, 2 * tol_for(k)).
TEST(Gemm, LinearForwardBf16WeightsMatchF32Weights) {
  std::mt19937 rng(777);
  for (int64_t k : {1, 7, 33, 260}) {
    for (int64_t n : {1, 5, 37, 131}) {
      const Bf16Weight w = random_bf16_weight({n, k}, rng);
      for (int64_t m : {1, 3, 8, 9, 17, 70}) {
        Tensor x = random_tensor({m, k}, rng);
        Tensor o16 = Tensor::full({m, n}, std::numeric_limits<float>::quiet_NaN());
        Tensor o32 = Tensor::full({m, n}, std::numeric_limits<float>::quiet_NaN());
        linear_forward(host_exec(), x, w.bf16, o16);
        linear_forward(host_exec(), x, w.f32, o32);
        const auto ref = ref_matmul(x, false, w.f32, true, {}, m, n, k, 1.0, 0.0);
        double err16 = 0, err32 = 0, diff = 0;
        for (int64_t i = 0; i < m * n; ++i) {
          err16 = std::max(err16, std::abs(o16.data<float>()[i] - ref[i]));
          err32 = std::max(err32, std::abs(o32.data<float>()[i] - ref[i]));
          diff = std::max(diff, std::abs(double(o16.data<float>()[i]) - o32.data<float>()[i]));
        }
        ASSERT_LT(err16, tol_for(k)) << "m=" << m << " n=" << n << " k=" << k;
        ASSERT_LT(err32, tol_for(k));
        ASSERT_LE(diff, 2 * tol_for(k));
        if (m >= 2 && m <= 8) {
          ASSERT_EQ(count_differing(o16, o32), 0) << "m=" << m << " n=" << n << " k=" << k;
        }
      }
    }
  }
}

// Enough columns for several widened panels (panels of 2^20 / k rows), and beta = 1 accumulating.
TEST(Gemm, LinearForwardBf16WeightsPanelsAndBeta) {
  std::mt19937 rng(4321);
  const int64_t m = 11, k = 40000, n = 61;  // panels of 26 rows: 26 + 26 + 9
  const Bf16Weight w = random_bf16_weight({n, k}, rng);
  Tensor x = random_tensor({m, k}, rng);
  Tensor o16 = random_tensor({m, n}, rng);
  std::vector<float> out0(o16.data<float>(), o16.data<float>() + o16.numel());
  linear_forward(host_exec(), x, w.bf16, o16, 1.0f);
  const auto ref = ref_matmul(x, false, w.f32, true, out0, m, n, k, 1.0, 1.0);
  double err = 0;
  for (int64_t i = 0; i < m * n; ++i) err = std::max(err, std::abs(o16.data<float>()[i] - ref[i]));
  std::printf("bf16 weights, 3 panels, beta 1: max abs err %.3g\n", err);
  // Sums of 40000 products of magnitude <= 1 grow like sqrt(k): the error is far below the
  // worst-case 4 * k * eps.
  EXPECT_LT(err, tol_for(k));
}

// Batch-invariant mode with bf16 weights: every row is bit-identical whatever the row count, and
// bit-identical to the f32 weight of the same values (one kernel: bf16 widened in registers up to
// 8 rows, widened into L2-sized panels of b beyond; k = 1000 gives panels of 64 rows, 3 of them).
TEST(Gemm, Bf16WeightsBatchInvariantBitIdentical) {
  std::mt19937 rng(31);
  for (const auto& [k, n] : {std::pair<int64_t, int64_t>{131, 77}, {1000, 150}}) {
    const int64_t rows = 150;
    const Bf16Weight w = random_bf16_weight({n, k}, rng);
    Tensor x = random_tensor({rows, k}, rng);
    Exec ex;
    ex.batch_invariant = true;
    Tensor all16 = Tensor::empty({rows, n}), all32 = Tensor::empty({rows, n});
    linear_forward(ex, x, w.bf16, all16);
    linear_forward(ex, x, w.f32, all32);
    EXPECT_EQ(count_differing(all16, all32), 0) << "k=" << k;
    for (int64_t m : {1, 2, 5, 8, 9, 64, 65, 149}) {
      const int64_t first = std::uniform_int_distribution<int64_t>(0, rows - m)(rng);
      Tensor part = Tensor::empty({m, n});
      linear_forward(ex, x.slice(0, first, first + m), w.bf16, part);
      EXPECT_EQ(count_differing(part, all16.slice(0, first, first + m).clone()), 0)
          << "k=" << k << " m=" << m << " first=" << first;
    }
  }
}

TEST(GemmDeathTest, F16WeightsAbort) {
  Tensor x = Tensor::zeros({4, 8}), w = Tensor::empty({5, 8}, DType::kF16);
  Tensor out = Tensor::zeros({4, 5});
  EXPECT_DEATH(linear_forward(host_exec(), x, w, out), "contiguous f32, bf16 or fp8");
}

TEST(GemmDeathTest, ShapeMismatchAborts) {
  Tensor x = Tensor::zeros({4, 8}), w = Tensor::zeros({5, 7}), out = Tensor::zeros({4, 5});
  EXPECT_DEATH(linear_forward(host_exec(), x, w, out), "linear_forward");
}

}  // namespace
}  // namespace loom
