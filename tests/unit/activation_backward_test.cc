// silu_mul_backward and embedding_backward against central differences of double reference
// forwards (tests/unit/gradcheck_support.h describes the method).
//
// Bounds. silu_mul's gradients are a handful of f32 operations per element (an exp good to ~1 ulp,
// a division, four products): <= ~8 u = 5e-7 relative per element, so 1e-6 relative L2. The
// embedding's forward is linear in the table, so its differences are exact up to double rounding
// and the f32 backward (sums of at most 4 rows of O(1) values) is within a few u: 1e-6 as well; it
// is also checked bit for bit against a serial f32 sum in token order.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/activation.h"
#include "tests/unit/gradcheck_support.h"

namespace loom::gradcheck {
namespace {

constexpr double kGradTol = 1e-6;
constexpr double kForwardTol = 1e-6;

TEST(SiluMulBackward, MatchesFiniteDifferences) {
  std::mt19937 rng(3);
  const Shape shape{7, 13};
  Tensor gate = random_tensor(shape, rng, -10.0f, 10.0f);
  Tensor up = random_tensor(shape, rng, -2.0f, 2.0f);
  Tensor r = random_tensor(shape, rng);
  std::vector<double> gd = to_double(gate), ud = to_double(up);
  auto ref = [&] {
    std::vector<double> out(gd.size());
    for (size_t i = 0; i < gd.size(); ++i) out[i] = gd[i] / (1.0 + std::exp(-gd[i])) * ud[i];
    return out;
  };
  auto j = [&] { return project(ref(), r); };
  Tensor out = Tensor::empty(shape);
  silu_mul_forward(host_exec(), gate, up, out);
  expect_forward_close("silu_mul", out, ref(), kForwardTol);

  Tensor dgate = Tensor::empty(shape), dup = Tensor::empty(shape);
  silu_mul_backward(host_exec(), gate, up, r, dgate, dup);
  expect_grad_close("silu_mul dgate", dgate, central_diff(j, gd), kGradTol);
  expect_grad_close("silu_mul dup", dup, central_diff(j, ud), kGradTol);

  // In place over the inputs (dgate over gate, dup over up): the same bits.
  Tensor g2 = gate.clone(), u2 = up.clone();
  silu_mul_backward(host_exec(), g2, u2, r, g2, u2);
  EXPECT_EQ(std::memcmp(g2.raw(), dgate.raw(), dgate.nbytes()), 0);
  EXPECT_EQ(std::memcmp(u2.raw(), dup.raw(), dup.nbytes()), 0);
}

template <typename Id>
void check_embedding_backward(DType dtype) {
  std::mt19937 rng(17);
  const int64_t v = 11, d = 9, t = 23;
  Tensor ids = Tensor::empty({t}, dtype);
  std::uniform_int_distribution<int> pick(0, 5);  // ids 0..5 only: repeats, and rows never named
  for (int64_t i = 0; i < t; ++i) ids.data<Id>()[i] = static_cast<Id>(pick(rng));
  Tensor table = random_tensor({v, d}, rng);
  Tensor r = random_tensor({t, d}, rng);
  std::vector<double> td = to_double(table);
  auto ref = [&] {
    std::vector<double> out(t * d);
    for (int64_t i = 0; i < t; ++i)
      for (int64_t c = 0; c < d; ++c) out[i * d + c] = td[ids.data<Id>()[i] * d + c];
    return out;
  };
  auto j = [&] { return project(ref(), r); };
  Tensor out = Tensor::empty({t, d});
  embedding_forward(host_exec(), ids, table, out);
  expect_forward_close("embedding", out, ref(), 0.0);

  Tensor dtable = Tensor::zeros({v, d});
  embedding_backward(host_exec(), ids, r, dtable);
  expect_grad_close("embedding dtable", dtable, central_diff(j, td), kGradTol);

  // Accumulated onto what the table held, bit for bit a serial f32 sum in token order.
  dtable.fill(0.5f);
  embedding_backward(host_exec(), ids, r, dtable);
  Tensor serial = Tensor::full({v, d}, 0.5f);
  for (int64_t i = 0; i < t; ++i)
    for (int64_t c = 0; c < d; ++c) serial.at<float>({ids.data<Id>()[i], c}) += r.at<float>({i, c});
  EXPECT_EQ(std::memcmp(serial.raw(), dtable.raw(), dtable.nbytes()), 0);
}

TEST(EmbeddingBackward, MatchesFiniteDifferencesI32) {
  check_embedding_backward<int32_t>(DType::kI32);
}
TEST(EmbeddingBackward, MatchesFiniteDifferencesI64) {
  check_embedding_backward<int64_t>(DType::kI64);
}

// Same inputs, same bits, whatever the thread count (sizes above the parallel thresholds), and the
// same as a serial sum in token order.
TEST(EmbeddingBackward, SameBitsForAnyThreadCount) {
  std::mt19937 rng(4);
  const int64_t v = 97, d = 333, t = 517;
  Tensor ids = Tensor::empty({t}, DType::kI64);
  std::uniform_int_distribution<int64_t> pick(0, v - 1);
  for (int64_t i = 0; i < t; ++i) ids.data<int64_t>()[i] = pick(rng);
  Tensor g = random_tensor({t, d}, rng);
  Tensor serial = Tensor::zeros({v, d});
  for (int64_t i = 0; i < t; ++i)
    for (int64_t c = 0; c < d; ++c)
      serial.at<float>({ids.data<int64_t>()[i], c}) += g.at<float>({i, c});
  expect_same_bits_for_any_thread_count([&](int threads) {
    Tensor dtable = Tensor::zeros({v, d});
    embedding_backward(host_exec(), ids, g, dtable);
    EXPECT_EQ(std::memcmp(serial.raw(), dtable.raw(), dtable.nbytes()), 0) << threads;
    return std::vector<Tensor>{dtable};
  });
}

TEST(EmbeddingBackwardDeathTest, RejectsIdOutOfRangeBeforeWriting) {
  Tensor ids = Tensor::empty({2}, DType::kI32);
  ids.data<int32_t>()[0] = 1;
  ids.data<int32_t>()[1] = 4;
  Tensor g = Tensor::full({2, 3}, 1.0f);
  Tensor dtable = Tensor::zeros({4, 3});
  EXPECT_DEATH(embedding_backward(host_exec(), ids, g, dtable), "outside");
}

}  // namespace
}  // namespace loom::gradcheck
