// rope_backward against central differences of a double reference forward
// (tests/unit/gradcheck_support.h describes the method), for both pairings, partial rotary dims at
// an offset (qwen3_next's partial rotary, MLA's rope part after d_n), YaRN's table and attention
// factor, and arbitrary positions.
//
// Bounds. Each gradient element is two f32 products and a sum, with cos and sin of the f32 angle
// good to ~1 ulp and the attention factor one more product: <= ~6 u = 4e-7 relative per element
// (the rotation is orthogonal, so nothing cancels beyond that), hence 1e-6 relative L2.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/rope.h"
#include "tests/unit/gradcheck_support.h"

namespace loom::gradcheck {
namespace {

constexpr double kGradTol = 1e-6;
constexpr double kForwardTol = 1e-6;

// rope_forward in double; the angle is the f32 product inv_freq * position, as in the kernel and
// the references' f32 rotary tables.
std::vector<double> rope_ref(const std::vector<double>& x, Shape shape,
                             const std::vector<int64_t>& positions, const RopeTable& table,
                             int64_t offset) {
  const int64_t t_count = shape[0], heads = shape[1], d = shape[2];
  const int half = table.rotary_dim / 2;
  const bool interleaved = table.style == RopeStyle::kInterleaved;
  std::vector<double> out = x;
  for (int64_t t = 0; t < t_count; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const double* v = x.data() + (t * heads + h) * d + offset;
      double* o = out.data() + (t * heads + h) * d + offset;
      for (int i = 0; i < half; ++i) {
        const float angle = table.inv_freq.data<float>()[i] * static_cast<float>(positions[t]);
        const double c = std::cos(double(angle)) * table.attention_factor;
        const double s = std::sin(double(angle)) * table.attention_factor;
        const double a = interleaved ? v[2 * i] : v[i];
        const double b = interleaved ? v[2 * i + 1] : v[i + half];
        o[i] = a * c - b * s;
        o[i + half] = b * c + a * s;
      }
    }
  }
  return out;
}

struct RopeCase {
  const char* name;
  RopeStyle style;
  int rotary_dim;
  int64_t head_dim;
  int64_t offset;
  bool yarn;
};

class RopeBackward : public ::testing::TestWithParam<RopeCase> {};

TEST_P(RopeBackward, MatchesFiniteDifferences) {
  const RopeCase c = GetParam();
  const RopeTable table = c.yarn ? rope_table_yarn(10000.0, c.rotary_dim, c.style, 40.0, 4096.0,
                                                   32.0, 1.0, 1.0, 0.0, -1.0, true)
                                 : rope_table_default(10000.0, c.rotary_dim, c.style);
  if (c.yarn) {
    ASSERT_NE(table.attention_factor, 1.0f);
  }
  const std::vector<int64_t> positions = {0, 5, 1000, 3, 77};
  const Shape shape{5, 3, c.head_dim};
  Tensor pos = Tensor::empty({5}, DType::kI64);
  std::copy(positions.begin(), positions.end(), pos.data<int64_t>());
  std::mt19937 rng(31);
  Tensor x = random_tensor(shape, rng), r = random_tensor(shape, rng);
  std::vector<double> xd = to_double(x);

  Tensor out = x.clone();
  rope_forward(host_exec(), out, pos, table, c.offset);
  expect_forward_close(c.name, out, rope_ref(xd, shape, positions, table, c.offset), kForwardTol);

  Tensor dx = r.clone();
  rope_backward(host_exec(), dx, pos, table, c.offset);
  auto j = [&] { return project(rope_ref(xd, shape, positions, table, c.offset), r); };
  expect_grad_close(c.name, dx, central_diff(j, xd), kGradTol);
  // Dims outside the rotary range pass their gradient through untouched.
  for (int64_t row = 0; row < 15; ++row) {
    for (int64_t i = 0; i < c.head_dim; ++i) {
      if (i < c.offset || i >= c.offset + c.rotary_dim) {
        ASSERT_EQ(dx.data<float>()[row * c.head_dim + i], r.data<float>()[row * c.head_dim + i]);
      }
    }
  }

  // The backward is the inverse rotation: backward(forward(x)) = attention_factor^2 x.
  rope_backward(host_exec(), out, pos, table, c.offset);
  const double af2 = double(table.attention_factor) * table.attention_factor;
  std::vector<double> scaled = xd;
  for (int64_t row = 0; row < 15; ++row)
    for (int64_t i = c.offset; i < c.offset + c.rotary_dim; ++i)
      scaled[row * c.head_dim + i] *= af2;
  expect_forward_close("rope backward(forward(x))", out, scaled, kForwardTol);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, RopeBackward,
    ::testing::Values(
        RopeCase{"rope half full dx", RopeStyle::kHalf, 10, 10, 0, false},
        RopeCase{"rope half partial dx", RopeStyle::kHalf, 6, 13, 3, false},
        RopeCase{"rope interleaved partial dx", RopeStyle::kInterleaved, 8, 15, 7, false},
        RopeCase{"rope interleaved yarn dx", RopeStyle::kInterleaved, 14, 14, 0, true},
        RopeCase{"rope half yarn dx", RopeStyle::kHalf, 6, 9, 1, true}),
    [](const auto& info) { return std::to_string(info.index); });

}  // namespace
}  // namespace loom::gradcheck
