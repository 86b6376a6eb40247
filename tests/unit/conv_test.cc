// Causal depthwise convolution: prefill against a naive loop, every split of a sequence (pieces,
// single tokens, batched decode steps) bit-identical to the full prefill, and the varlen form
// bit-identical to the per-sequence prefill.
#include "kernels/conv.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace loom {
namespace {

Tensor randn(Shape s, std::mt19937& rng) {
  Tensor t = Tensor::empty(s);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = nd(rng);
  return t;
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() &&
         std::equal(a.data<float>(), a.data<float>() + a.numel(), b.data<float>());
}

// Naive double-precision reference; returns out [T, C] and the new state [W-1, C].
void naive(const Tensor& x, const Tensor& w, const Tensor& state, bool silu,
           std::vector<double>& out, std::vector<float>& new_state) {
  const int64_t T = x.dim(0), C = x.dim(1), W = w.dim(1), P = W - 1;
  std::vector<float> xpad((P + T) * C);
  std::copy(state.data<float>(), state.data<float>() + P * C, xpad.begin());
  std::copy(x.data<float>(), x.data<float>() + T * C, xpad.begin() + P * C);
  out.assign(T * C, 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0;
      for (int64_t j = 0; j < W; ++j)
        acc += double(w.data<float>()[c * W + j]) * xpad[(t + j) * C + c];
      out[t * C + c] = silu ? acc / (1.0 + std::exp(-acc)) : acc;
    }
  new_state.assign(xpad.end() - P * C, xpad.end());
}

TEST(CausalConv1d, ForwardMatchesNaive) {
  std::mt19937 rng(1);
  for (int64_t W : {1, 2, 4}) {
    for (int64_t T : {1, 2, 3, 5, 200}) {
      for (bool silu : {false, true}) {
        const int64_t C = 37;
        Tensor x = randn({T, C}, rng), w = randn({C, W}, rng), st = randn({W - 1, C}, rng);
        std::vector<double> ref;
        std::vector<float> ref_state;
        naive(x, w, st, silu, ref, ref_state);
        Tensor out = Tensor::empty({T, C});
        causal_conv1d_forward(host_exec(), x, w, st, silu, out);
        double m = 0;
        for (int64_t i = 0; i < T * C; ++i)
          m = std::max(m, std::abs(out.data<float>()[i] - ref[i]));
        // At most W f32 products summed: a few ulp of values of size ~W.
        EXPECT_LT(m, 1e-5) << "W=" << W << " T=" << T << " silu=" << silu;
        EXPECT_TRUE(std::equal(ref_state.begin(), ref_state.end(), st.data<float>()))
            << "W=" << W << " T=" << T;
      }
    }
  }
}

TEST(CausalConv1d, LargeParallelForwardMatchesNaive) {
  std::mt19937 rng(2);
  const int64_t T = 3001, C = 1100, W = 4;
  Tensor x = randn({T, C}, rng), w = randn({C, W}, rng), st = randn({W - 1, C}, rng);
  std::vector<double> ref;
  std::vector<float> ref_state;
  naive(x, w, st, true, ref, ref_state);
  Tensor out = Tensor::empty({T, C});
  causal_conv1d_forward(host_exec(), x, w, st, true, out);
  double m = 0;
  for (int64_t i = 0; i < T * C; ++i) m = std::max(m, std::abs(out.data<float>()[i] - ref[i]));
  EXPECT_LT(m, 1e-5);
  EXPECT_TRUE(std::equal(ref_state.begin(), ref_state.end(), st.data<float>()));
}

TEST(CausalConv1d, SplitsEqualFullPrefillExactly) {
  std::mt19937 rng(3);
  const int64_t T = 211, C = 45, W = 4;
  Tensor x = randn({T, C}, rng), w = randn({C, W}, rng), st0 = randn({W - 1, C}, rng);
  Tensor full_state = st0.clone(), full_out = Tensor::empty({T, C});
  causal_conv1d_forward(host_exec(), x, w, full_state, true, full_out);
  // Random pieces, including single tokens and pieces shorter than W - 1.
  for (int trial = 0; trial < 5; ++trial) {
    std::vector<int64_t> cuts{0};
    std::uniform_int_distribution<int64_t> len(1, trial == 0 ? 1 : 2 + 20 * trial);
    while (cuts.back() < T) cuts.push_back(std::min(T, cuts.back() + len(rng)));
    Tensor state = st0.clone(), out = Tensor::empty({T, C});
    for (size_t i = 0; i + 1 < cuts.size(); ++i)
      causal_conv1d_forward(host_exec(), x.slice(0, cuts[i], cuts[i + 1]), w, state, true,
                            out.slice(0, cuts[i], cuts[i + 1]));
    EXPECT_TRUE(bit_equal(out, full_out)) << "trial " << trial;
    EXPECT_TRUE(bit_equal(state, full_state)) << "trial " << trial;
  }
}

void batched_steps_check(int64_t B, int64_t T, int64_t C, int64_t W, uint32_t seed) {
  std::mt19937 rng(seed);
  Tensor w = randn({C, W}, rng);
  std::vector<Tensor> xs, outs, states0;
  Tensor states = Tensor::empty({B, W - 1, C});
  for (int64_t b = 0; b < B; ++b) {
    xs.push_back(randn({T, C}, rng));
    states0.push_back(randn({W - 1, C}, rng));
    states.select(b).copy_from(states0[b]);
  }
  for (bool silu : {false, true}) {
    Tensor st = states.clone();
    std::vector<Tensor> full_out, full_state;
    for (int64_t b = 0; b < B; ++b) {
      full_state.push_back(states0[b].clone());
      full_out.push_back(Tensor::empty({T, C}));
      causal_conv1d_forward(host_exec(), xs[b], w, full_state[b], silu, full_out[b]);
    }
    Tensor xt = Tensor::empty({B, C}), ot = Tensor::empty({B, C});
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t b = 0; b < B; ++b) xt.select(b).copy_from(xs[b].select(t));
      causal_conv1d_step(host_exec(), xt, w, st, silu, ot);
      for (int64_t b = 0; b < B; ++b)
        ASSERT_TRUE(bit_equal(ot.select(b), full_out[b].select(t))) << "t=" << t << " b=" << b;
    }
    for (int64_t b = 0; b < B; ++b) EXPECT_TRUE(bit_equal(st.select(b), full_state[b])) << b;
  }
}

TEST(CausalConv1d, BatchedStepsEqualPrefillExactly) {
  batched_steps_check(3, 50, 33, 4, 4);
  // Many channels: the step and the prefill split the channels into parallel blocks.
  batched_steps_check(3, 20, 3 * 1024 + 5, 4, 5);
  batched_steps_check(3, 7, 19, 2, 6);
}

// One causal_conv1d_varlen over sequences of `lens` rows (slots drawn at random from a pool with
// unused slots) against causal_conv1d_forward per sequence on its slot: bit-identical outputs and
// pool, unused slots untouched.
void varlen_check(const std::vector<int64_t>& lens, int64_t C, int64_t W, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t B = static_cast<int64_t>(lens.size());
  std::vector<int64_t> cu{0};
  for (int64_t n : lens) cu.push_back(cu.back() + n);
  const int64_t N = cu.back(), num_slots = B + 3;
  std::vector<int32_t> order(num_slots);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  Tensor slots = Tensor::empty({B}, DType::kI32), cu_t = Tensor::empty({B + 1}, DType::kI64);
  std::copy(order.begin(), order.begin() + B, slots.data<int32_t>());
  std::copy(cu.begin(), cu.end(), cu_t.data<int64_t>());
  Tensor x = randn({N, C}, rng), w = randn({C, W}, rng);
  for (bool silu : {false, true}) {
    const Tensor pool = randn({num_slots, W - 1, C}, rng), want_pool = pool.clone();
    Tensor want = Tensor::empty({N, C}), got = Tensor::empty({N, C});
    for (int64_t b = 0; b < B; ++b)
      causal_conv1d_forward(host_exec(), x.slice(0, cu[b], cu[b + 1]), w,
                            want_pool.select(order[b]), silu, want.slice(0, cu[b], cu[b + 1]));
    causal_conv1d_varlen(host_exec(), x, w, pool, slots, cu_t, silu, got);
    EXPECT_TRUE(bit_equal(got, want)) << "C=" << C << " W=" << W << " silu=" << silu;
    EXPECT_TRUE(bit_equal(pool, want_pool)) << "C=" << C << " W=" << W << " silu=" << silu;
  }
}

TEST(CausalConv1dVarlen, EqualsPerSequencePrefillExactly) {
  varlen_check({1, 7, 64, 65, 130}, 37, 4, 20);
  varlen_check({130, 1, 65, 2, 64, 7, 1}, 45, 2, 21);
  // Many channels: the prefill splits them into parallel blocks.
  varlen_check({65, 1, 7}, 3 * 1024 + 5, 4, 22);
  // Decode batches (one token each) run as one step over the slots.
  varlen_check({1, 1, 1, 1, 1}, 37, 4, 23);
  varlen_check(std::vector<int64_t>(9, 1), 3 * 1024 + 5, 4, 24);
  varlen_check({1, 1}, 19, 1, 25);  // no state at all
}

}  // namespace
}  // namespace loom
