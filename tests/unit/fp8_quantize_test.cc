// Loom's stored FP8 matrices (core/fp8_matrix.h): the e4m3 encoder against a reference that
// searches every finite code, the 128 x 128 block quantizer against a double-precision reference
// (partial edge blocks, all-zero blocks, stacks of experts), and the CPU GEMMs that read FP8
// weights against the same weights dequantized to f32 (bit for bit in batch-invariant mode).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/fp8_matrix.h"
#include "kernels/gemm.h"
#include "kernels/moe.h"
#include "weights/fp8.h"

namespace loom {
namespace {

// The reference encoder: the finite e4m3fn code whose value is nearest to x (computed in double,
// exactly), ties to the code with an even mantissa, and +-448 for anything beyond it. It searches
// all 127 non-negative finite codes, so it shares nothing with the encoder under test.
uint8_t reference_encode(double x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(x);
  int best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  for (int c = 0; c < 0x7F; ++c) {
    const double err = std::fabs(double(f8e4m3_to_f32(uint8_t(c))) - a);
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = c;
      best_err = err;
    }
  }
  return sign | uint8_t(best);
}

TEST(Fp8Encode, MatchesTheReferenceOnEveryCodeTieAndNeighbour) {
  std::vector<double> xs = {0.0,     -0.0,    448.0,
                            449.0,   464.0,   479.0,
                            480.0,   1e9,     std::numeric_limits<double>::infinity(),
                            0x1p-10, 0x1p-11, 1e-30};
  for (int c = 0; c < 0x7F; ++c) {
    const double v = f8e4m3_to_f32(uint8_t(c));
    const double next = c + 1 < 0x7F ? f8e4m3_to_f32(uint8_t(c + 1)) : 480.0;
    const double mid = (v + next) / 2;  // a tie: to the even code
    for (double x : {v, mid, std::nextafter(mid, 0.0), std::nextafter(mid, 1e9),
                     std::nextafter(v, 1e9), (v + mid) / 2})
      xs.push_back(x);
  }
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> mag(-12.0, 9.5);
  for (int i = 0; i < 200000; ++i) xs.push_back(std::exp2(mag(rng)) * (rng() & 1 ? 1 : -1));
  int subnormal_ties = 0;
  for (double x : xs) {
    for (double s : {x, -x}) {
      const uint8_t got = f32_to_f8e4m3(s), want = reference_encode(s);
      ASSERT_EQ(got, want) << "x = " << s;
      ASSERT_NE(got & 0x7F, 0x7F) << "NaN code for " << s;
    }
    subnormal_ties += std::fabs(x) < 0x1p-6 && std::fmod(std::fabs(x), 0x1p-9) == 0x1p-10;
  }
  EXPECT_GT(subnormal_ties, 0) << "the subnormal ties were covered";
  EXPECT_EQ(f32_to_f8e4m3(0x1p-10), 0x00);      // halfway to the smallest subnormal: even (0)
  EXPECT_EQ(f32_to_f8e4m3(3 * 0x1p-10), 0x02);  // 1.5 subnormal quanta: up to 2
  EXPECT_EQ(f32_to_f8e4m3(1.0625), 0x38);       // halfway between 1 and 1.125: even (1)
  EXPECT_EQ(f32_to_f8e4m3(1.1875), 0x3A);       // halfway between 1.125 and 1.25: 1.25
  EXPECT_EQ(f32_to_f8e4m3(464.0), 0x7E);        // halfway to 480 (not finite): saturates
  EXPECT_EQ(f32_to_f8e4m3(-1e9), 0xFE);
  EXPECT_EQ(f32_to_f8e4m3(-0.0), 0x80);
}

// The double-precision reference of the quantizer (weights/fp8.h): per block, amax in double,
// scale_inv = f32(amax / 448) (1 for a zero block), q = reference_encode(w / scale_inv) in double.
struct Reference {
  std::vector<float> scales;
  std::vector<uint8_t> q;
};
Reference reference_quantize(const std::vector<float>& w, int64_t stack, int64_t rows,
                             int64_t cols) {
  const int64_t gr = (rows + 127) / 128, gc = (cols + 127) / 128;
  Reference r{std::vector<float>(stack * gr * gc), std::vector<uint8_t>(w.size())};
  for (int64_t e = 0; e < stack; ++e) {
    for (int64_t bi = 0; bi < gr; ++bi) {
      for (int64_t bj = 0; bj < gc; ++bj) {
        double amax = 0;
        for (int64_t i = bi * 128; i < std::min(rows, bi * 128 + 128); ++i)
          for (int64_t j = bj * 128; j < std::min(cols, bj * 128 + 128); ++j)
            amax = std::max(amax, std::fabs(double(w[(e * rows + i) * cols + j])));
        const float s = amax == 0 ? 1.0f : float(amax / 448.0);
        r.scales[(e * gr + bi) * gc + bj] = s;
        for (int64_t i = bi * 128; i < std::min(rows, bi * 128 + 128); ++i)
          for (int64_t j = bj * 128; j < std::min(cols, bj * 128 + 128); ++j) {
            const int64_t k = (e * rows + i) * cols + j;
            r.q[k] = reference_encode(double(w[k]) / double(s));
          }
      }
    }
  }
  return r;
}

// Trained-like weights: a heavy-tailed mix of scales per block, so blocks differ in amax.
Tensor random_weights(const Shape& shape, uint64_t seed, bool zero_first_block = false) {
  Tensor t = Tensor::empty(shape);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 0.02f);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = n(rng) * (i % 97 == 0 ? 8.0f : 1.0f);
  if (zero_first_block) {
    const int64_t rows = shape[shape.ndim() - 2], cols = shape[shape.ndim() - 1];
    for (int64_t i = 0; i < std::min<int64_t>(128, rows); ++i)
      for (int64_t j = 0; j < std::min<int64_t>(128, cols); ++j) p[i * cols + j] = 0.0f;
  }
  return t;
}

// Every code and scale bit-exact against the reference; the dequantized values within half an
// e4m3 step of the weights; the quantization error (relative L2) printed.
void check_quantizer(const Shape& shape, const Shape& grid, bool zero_block) {
  const Tensor w = random_weights(shape, shape.numel(), zero_block);
  Tensor q = fp8_matrix_empty(shape);
  ASSERT_TRUE(quantize_fp8_blocks(w, q, "w").ok());
  const Tensor s = fp8_matrix_scales(q);
  ASSERT_EQ(s.shape(), grid);
  const int64_t rows = shape[shape.ndim() - 2], cols = shape[shape.ndim() - 1];
  const std::vector<float> wv(w.data<float>(), w.data<float>() + w.numel());
  const Reference ref = reference_quantize(wv, w.numel() / (rows * cols), rows, cols);
  ASSERT_EQ(std::memcmp(s.raw(), ref.scales.data(), ref.scales.size() * 4), 0);
  const auto* qp = static_cast<const uint8_t*>(q.raw());
  int64_t differ = 0, nan = 0;
  for (size_t i = 0; i < ref.q.size(); ++i) {
    differ += qp[i] != ref.q[i];
    nan += (qp[i] & 0x7F) == 0x7F;
  }
  EXPECT_EQ(differ, 0);
  EXPECT_EQ(nan, 0);
  if (zero_block) {
    EXPECT_EQ(s.data<float>()[0], 1.0f);
    EXPECT_EQ(qp[0], 0);
  }
  // Dequantized as the checkpoint loader does: every value is the weight's nearest grid point.
  auto deq = dequantize_fp8_blocks(q, s, 128, 128, "w");
  ASSERT_TRUE(deq.ok()) << deq.status();
  double err2 = 0, ref2 = 0;
  for (int64_t i = 0; i < w.numel(); ++i) {
    const double e = double(deq->data<float>()[i]) - wv[i];
    err2 += e * e;
    ref2 += double(wv[i]) * wv[i];
  }
  std::printf("fp8 quantization of %s (scales %s): relative L2 error %.4g\n",
              shape.to_string().c_str(), grid.to_string().c_str(), std::sqrt(err2 / ref2));
  EXPECT_LT(std::sqrt(err2 / ref2), 0.04);  // 3 mantissa bits: about 2^-4 / sqrt(3) at most
}

TEST(Fp8Quantize, DeepSeekPartialRowBlocks) { check_quantizer({576, 7168}, {5, 56}, false); }
TEST(Fp8Quantize, OddSizesAndAZeroBlock) { check_quantizer({130, 257}, {2, 3}, true); }
TEST(Fp8Quantize, StackedExperts) { check_quantizer({3, 130, 200}, {3, 2, 2}, false); }
TEST(Fp8Quantize, SmallerThanOneBlock) { check_quantizer({5, 7}, {1, 1}, false); }

TEST(Fp8Quantize, NonFiniteWeightsAreRefused) {
  Tensor w = random_weights({4, 4}, 1);
  w.data<float>()[5] = std::numeric_limits<float>::infinity();
  Tensor q = fp8_matrix_empty({4, 4});
  const absl::Status st = quantize_fp8_blocks(w, q, "layers.0.x.weight");
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("layers.0.x.weight"), std::string_view::npos) << st;
}

TEST(Fp8Matrix, ViewsCarryNoScales) {
  Tensor q = fp8_matrix_empty({256, 128});
  EXPECT_EQ(fp8_matrix_scales(q).shape(), Shape({2, 1}));
  EXPECT_DEATH(fp8_matrix_scales(q.slice(0, 0, 128)), "carries no block scales");
}

// f32 weights holding exactly the FP8 matrix's dequantized values.
Tensor dequantized(const Tensor& q) {
  auto w = dequantize_fp8_blocks(q, fp8_matrix_scales(q), 128, 128, "w");
  EXPECT_TRUE(w.ok()) << w.status();
  return *w;
}

Tensor quantized(const Shape& shape, uint64_t seed) {
  Tensor q = fp8_matrix_empty(shape);
  EXPECT_TRUE(quantize_fp8_blocks(random_weights(shape, seed), q, "w").ok());
  return q;
}

Tensor random_rows(int64_t m, int64_t k, uint64_t seed) {
  Tensor x = Tensor::empty({m, k});
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = n(rng);
  return x;
}

// linear_forward with an FP8 w against the f32 w of its dequantized values: every row count (1
// row, the few-row kernel, 9-32 rows, OpenBLAS beyond), partial blocks on both dimensions.
TEST(Fp8Gemm, LinearForwardIsTheDequantizedF32Product) {
  for (const Shape& ws : {Shape({130, 257}), Shape({384, 256}), Shape({576, 300})}) {
    const Tensor q = quantized(ws, ws.numel()), w = dequantized(q);
    const int64_t n = ws[0], k = ws[1];
    for (int64_t m : {1, 3, 8, 9, 31, 33, 100}) {
      const Tensor x = random_rows(m, k, m);
      for (bool invariant : {true, false}) {
        Exec ex{};
        ex.batch_invariant = invariant;
        Tensor a = Tensor::empty({m, n}), b = Tensor::empty({m, n});
        linear_forward(ex, x, w, a);
        linear_forward(ex, x, q, b);
        if (invariant) {
          ASSERT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << ws.to_string() << " m=" << m;
        } else {
          for (int64_t i = 0; i < a.numel(); ++i)
            ASSERT_NEAR(a.data<float>()[i], b.data<float>()[i],
                        1e-5 * (1 + std::fabs(a.data<float>()[i])))
                << ws.to_string() << " m=" << m << " [" << i << "]";
        }
      }
    }
  }
}

// In batch-invariant mode a row's result does not depend on the rows around it.
TEST(Fp8Gemm, BatchInvariantRowsDoNotDependOnTheBatch) {
  const Tensor q = quantized({300, 200}, 3);
  const Tensor x = random_rows(40, 200, 4);
  Exec ex{};
  ex.batch_invariant = true;
  Tensor all = Tensor::empty({40, 300});
  linear_forward(ex, x, q, all);
  for (int64_t m : {1, 2, 7, 13}) {
    Tensor part = Tensor::empty({m, 300});
    linear_forward(ex, x.slice(0, 0, m), q, part);
    ASSERT_EQ(std::memcmp(part.raw(), all.raw(), part.nbytes()), 0) << m;
  }
}

// The grouped expert SwiGLU with FP8 experts (each expert its own blocks; intermediate 200 is a
// partial block) against the same experts dequantized to f32.
TEST(Fp8Gemm, GroupedExpertSwigluIsTheDequantizedF32One) {
  const int64_t e = 3, inter = 200, d = 136;
  const Tensor gq = quantized({e, inter, d}, 5), uq = quantized({e, inter, d}, 6),
               dq = quantized({e, d, inter}, 7);
  const Tensor gf = dequantized(gq), uf = dequantized(uq), df = dequantized(dq);
  Tensor offsets = Tensor::empty({e + 1}, DType::kI32);
  const int32_t off[] = {0, 1, 1, 41};  // one row, none, 40 rows
  std::memcpy(offsets.raw(), off, sizeof off);
  const Tensor x = random_rows(41, d, 8);
  for (bool invariant : {true, false}) {
    Exec ex{};
    ex.batch_invariant = invariant;
    Tensor a = Tensor::empty({41, d}), b = Tensor::empty({41, d});
    moe_grouped_swiglu(ex, x, offsets, gf, uf, df, a);
    moe_grouped_swiglu(ex, x, offsets, gq, uq, dq, b);
    if (invariant) {
      EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
    } else {
      for (int64_t i = 0; i < a.numel(); ++i)
        ASSERT_NEAR(a.data<float>()[i], b.data<float>()[i],
                    1e-5 * (1 + std::fabs(a.data<float>()[i])));
    }
  }
}

}  // namespace
}  // namespace loom
