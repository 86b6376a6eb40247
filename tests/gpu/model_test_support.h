// What the whole-model GPU tests (tests/gpu/model_*_cuda_test.cc) share: where the fixtures are,
// random prompts, and the fixtures' relative L2 measure.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "gtest/gtest.h"

namespace loom {

// $LOOM_GPU_FIXTURES, else .device-fixtures (what tests/gpu/run.sh carries to the GPU machine),
// else ../shared/fixtures.
inline std::string fixtures_dir() {
  if (const char* env = std::getenv("LOOM_GPU_FIXTURES")) return env;
  if (std::filesystem::exists(".device-fixtures")) return ".device-fixtures";
  return "../shared/fixtures";
}

// `len` token ids in [3, min(vocab, 300)): clear of the fixtures' special tokens.
inline std::vector<int32_t> random_ids(int64_t len, int64_t vocab, std::mt19937_64& rng) {
  std::uniform_int_distribution<int32_t> d(3,
                                           static_cast<int32_t>(std::min<int64_t>(vocab, 300)) - 1);
  std::vector<int32_t> p(static_cast<size_t>(len));
  for (int32_t& t : p) t = d(rng);
  return p;
}

// The fixtures' f32 measure (fixtures/README.md): ||a - b|| / ||b|| over two equally long host f32
// tensors; infinite when a holds a non-finite value or the sizes differ.
inline double rel_l2(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.numel(), b.numel());
  if (a.numel() != b.numel()) return INFINITY;
  double num = 0, den = 0;
  const float* x = a.data<float>();
  const float* y = b.data<float>();
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (!std::isfinite(x[i])) return INFINITY;
    const double e = static_cast<double>(x[i]) - y[i];
    num += e * e;
    den += static_cast<double>(y[i]) * y[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// ||a - b|| / ||b|| over two host f32 tensors of one shape; ||a - b|| when b is zero (a gradient
// no token reached, e.g. an idle expert's, is zero on both sides).
inline double rel_l2_or_abs(const Tensor& a, const Tensor& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    const double d = static_cast<double>(a.data<float>()[i]) - b.data<float>()[i];
    num += d * d;
    den += static_cast<double>(b.data<float>()[i]) * b.data<float>()[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace loom
