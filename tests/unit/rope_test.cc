// rope_forward on the CPU against a double oracle, for both pairings, partial rotary dims at an
// offset, YaRN's attention factor and arbitrary (non-contiguous, large) positions. The angle is
// the f32 product inv_freq * position, as in the references' f32 rotary tables (transformers,
// fla); everything after it is exact in the oracle.
#include "kernels/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace loom {
namespace {

// Positions as the kernel takes them: an i64 tensor.
Tensor i64_tensor(const std::vector<int64_t>& values) {
  Tensor t = Tensor::empty({static_cast<int64_t>(values.size())}, DType::kI64);
  std::copy(values.begin(), values.end(), t.data<int64_t>());
  return t;
}

Tensor random_tensor(Shape shape, std::mt19937& rng) {
  Tensor t = Tensor::empty(shape);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

// Rotated copy of x in double. kHalf pairs (i, i + half); kInterleaved pairs (2i, 2i + 1) and
// writes the pair's results to (i, i + half) (HF apply_rotary_pos_emb_interleave).
std::vector<double> oracle(const Tensor& x, const std::vector<int64_t>& positions,
                           const RopeTable& table, int64_t offset) {
  const int64_t T = x.dim(0), H = x.dim(1), d = x.dim(2);
  const int half = table.rotary_dim / 2;
  std::vector<double> out(x.data<float>(), x.data<float>() + x.numel());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const float* v = x.data<float>() + (t * H + h) * d + offset;
      double* o = out.data() + (t * H + h) * d + offset;
      for (int i = 0; i < half; ++i) {
        const float angle = table.inv_freq.data<float>()[i] * static_cast<float>(positions[t]);
        const double c = std::cos(double(angle)) * table.attention_factor;
        const double s = std::sin(double(angle)) * table.attention_factor;
        const bool half_style = table.style == RopeStyle::kHalf;
        const double a = half_style ? v[i] : v[2 * i], b = half_style ? v[i + half] : v[2 * i + 1];
        o[i] = a * c - b * s;
        o[i + half] = b * c + a * s;
      }
    }
  }
  return out;
}

// Max |got - ref| over the tensor, in units of 2^-24 * max |ref|; dims outside the rotary range
// must be untouched (bit-exact).
double check(const Tensor& got, const Tensor& before, const std::vector<double>& ref,
             int64_t offset, int rotary_dim) {
  const int64_t d = got.dim(2);
  double m = 0, scale = 0;
  for (double r : ref) scale = std::max(scale, std::abs(r));
  for (int64_t i = 0; i < got.numel(); ++i) {
    const int64_t j = i % d;
    if (j < offset || j >= offset + rotary_dim) {
      EXPECT_EQ(got.data<float>()[i], before.data<float>()[i]) << "dim " << j << " was touched";
      continue;
    }
    m = std::max(m, std::abs(got.data<float>()[i] - ref[i]));
  }
  return m / (scale * 0x1p-24);
}

// f32 cos/sin of the same f32 angle (~1 ulp each), an f32 attention factor product and a
// two-term f32 sum: a few ulps of the largest entry. 16 leaves margin and is orders of magnitude
// below a swapped pair, a wrong sign or a wrong frequency.
constexpr double kTolUlps = 16;

struct Case {
  int64_t T, H, d, offset;
  int rotary_dim;
  RopeStyle style;
  bool yarn;
};

TEST(Rope, MatchesDoubleOracle) {
  std::mt19937 rng(3);
  const Case cases[] = {
      {5, 3, 32, 0, 32, RopeStyle::kHalf, false},   // full-dim, fla's GQA
      {7, 2, 64, 0, 16, RopeStyle::kHalf, false},   // partial (qwen3_next: 1/4 of the head)
      {9, 4, 48, 16, 30, RopeStyle::kHalf, false},  // odd pair count at an offset
      {6, 3, 72, 8, 64, RopeStyle::kInterleaved,
       true},  // MLA's q_rope / k_rope after the nope part
      {11, 1, 26, 0, 26, RopeStyle::kInterleaved, false},  // 13 pairs
  };
  double worst = 0;
  for (const Case& c : cases) {
    const RopeTable table = c.yarn ? rope_table_yarn(10000.0, c.rotary_dim, c.style, 40.0, 4096, 32,
                                                     1, 1.0, 0.0, -1, true)
                                   : rope_table_default(10000.0, c.rotary_dim, c.style);
    std::vector<int64_t> positions;
    for (int64_t t = 0; t < c.T; ++t)
      positions.push_back(t % 3 == 0 ? t : std::uniform_int_distribution<int64_t>(0, 40000)(rng));
    const Tensor x = random_tensor({c.T, c.H, c.d}, rng);
    Tensor y = x.clone();
    rope_forward(host_exec(), y, i64_tensor(positions), table, c.offset);
    const double e = check(y, x, oracle(x, positions, table, c.offset), c.offset, c.rotary_dim);
    worst = std::max(worst, e);
    EXPECT_LT(e, kTolUlps) << "T=" << c.T << " d=" << c.d << " offset=" << c.offset
                           << " rotary_dim=" << c.rotary_dim << (c.yarn ? " yarn" : "");
  }
  std::printf("[rope] worst error vs double: %.2f ulps of the largest entry\n", worst);
}

// Rotations preserve each pair's norm (times the attention factor squared) and make q . k depend
// on the positions only through their difference: what attention relies on.
TEST(Rope, DotProductDependsOnlyOnRelativePosition) {
  std::mt19937 rng(4);
  for (RopeStyle style : {RopeStyle::kHalf, RopeStyle::kInterleaved}) {
    const RopeTable table = rope_table_default(10000.0, 32, style);
    const Tensor q = random_tensor({1, 1, 32}, rng), k = random_tensor({1, 1, 32}, rng);
    double first = 0;
    for (int64_t shift : {0, 1, 100, 1000}) {
      Tensor qr = q.clone(), kr = k.clone();
      rope_forward(host_exec(), qr, i64_tensor({shift + 7}), table, 0);
      rope_forward(host_exec(), kr, i64_tensor({shift}), table, 0);
      double dot = 0;
      for (int i = 0; i < 32; ++i) dot += double(qr.data<float>()[i]) * kr.data<float>()[i];
      if (shift == 0) first = dot;
      // The f32 angle at position ~1e3 is off by up to ~3e-5 rad for the fastest pair.
      EXPECT_NEAR(dot, first, 1e-2) << "shift " << shift;
    }
  }
}

}  // namespace
}  // namespace loom
