// The packed-batch entry points of the trainer's sequence kernels on the CPU
// (causal_conv1d_varlen_backward, causal_attention_varlen_forward / _backward,
// kda_varlen_backward): each is one call of the single-sequence kernel per sequence, from zero
// states, in the form the forward took (the delta rule's recurrence up to kKdaRecurrentMaxTokens
// rows, the chunked form above), so every row's result is that call's, bit for bit; empty
// sequences and sequences shorter than the convolution's width included. And the offsets'
// contract: offsets that do not cover the rows, or a sequence longer than max_seqlen, abort with
// the op's name. The CUDA launches are checked against these in
// tests/gpu/varlen_backward_cuda_test.cc.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "kernels/attention_backward.h"
#include "kernels/conv.h"
#include "kernels/kda.h"
#include "kernels/kda_backward.h"
#include "kernels/norm.h"
#include "tests/unit/gradcheck_support.h"

namespace loom {
namespace {

using gradcheck::random_tensor;

Tensor offsets(const std::vector<int64_t>& cu) {
  Tensor t = Tensor::empty({static_cast<int64_t>(cu.size())}, DType::kI64);
  std::memcpy(t.raw(), cu.data(), t.nbytes());
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Lengths 5, 0, 1, 70 (one chunk and a bit), 2, 9 (just above the recurrence's limit).
const std::vector<int64_t> kCu = {0, 5, 5, 6, 76, 78, 87};
constexpr int64_t kLongest = 70;

TEST(VarlenBackward, ConvIsOneCallPerSequence) {
  std::mt19937 rng(11);
  const int64_t T = kCu.back(), C = 13, W = 4;
  const Tensor x = random_tensor({T, C}, rng, -2.0f, 2.0f), w = random_tensor({C, W}, rng);
  const Tensor dout = random_tensor({T, C}, rng);
  Tensor dx = Tensor::full({T, C}, 7.0f), dw = random_tensor({C, W}, rng);
  Tensor dx_each = Tensor::full({T, C}, 7.0f), dw_each = Tensor::empty({C, W});
  std::memcpy(dw_each.raw(), dw.raw(), dw.nbytes());
  causal_conv1d_varlen_backward(host_exec(), x, w, offsets(kCu), true, dout, dx, dw);
  for (size_t s = 0; s + 1 < kCu.size(); ++s) {
    const int64_t b = kCu[s], e = kCu[s + 1];
    causal_conv1d_backward(host_exec(), x.slice(0, b, e), w, Tensor(), true, dout.slice(0, b, e),
                           Tensor(), dx_each.slice(0, b, e), dw_each, Tensor());
  }
  EXPECT_TRUE(same_bits(dx, dx_each));
  EXPECT_TRUE(same_bits(dw, dw_each));
}

TEST(VarlenBackward, AttentionIsOneCallPerSequence) {
  std::mt19937 rng(12);
  const int64_t T = kCu.back(), Hq = 4, Hkv = 2, d = 8, dv = 6;
  const Tensor q = random_tensor({T, Hq, d}, rng), k = random_tensor({T, Hkv, d}, rng);
  const Tensor v = random_tensor({T, Hkv, dv}, rng), d_out = random_tensor({T, Hq, dv}, rng);
  const Tensor cu = offsets(kCu);
  Tensor out = Tensor::empty({T, Hq, dv}), lse = Tensor::empty({T, Hq});
  Tensor dq = Tensor::empty(q.shape()), dk = Tensor::empty(k.shape()),
         dvv = Tensor::empty(v.shape());
  causal_attention_varlen_forward(host_exec(), q, k, v, cu, kLongest, 0.3f, out, lse);
  causal_attention_varlen_backward(host_exec(), q, k, v, cu, kLongest, out, lse, d_out, 0.3f, dq,
                                   dk, dvv);
  Tensor out1 = Tensor::empty(out.shape()), lse1 = Tensor::empty(lse.shape());
  Tensor dq1 = Tensor::empty(q.shape()), dk1 = Tensor::empty(k.shape()),
         dv1 = Tensor::empty(v.shape());
  for (size_t s = 0; s + 1 < kCu.size(); ++s) {
    const int64_t b = kCu[s], e = kCu[s + 1];
    if (b == e) continue;
    causal_attention_forward(host_exec(), q.slice(0, b, e), k.slice(0, b, e), v.slice(0, b, e),
                             0.3f, out1.slice(0, b, e), lse1.slice(0, b, e));
    causal_attention_backward(host_exec(), q.slice(0, b, e), k.slice(0, b, e), v.slice(0, b, e),
                              out1.slice(0, b, e), lse1.slice(0, b, e), d_out.slice(0, b, e), 0.3f,
                              dq1.slice(0, b, e), dk1.slice(0, b, e), dv1.slice(0, b, e));
  }
  EXPECT_TRUE(same_bits(out, out1));
  EXPECT_TRUE(same_bits(lse, lse1));
  EXPECT_TRUE(same_bits(dq, dq1));
  EXPECT_TRUE(same_bits(dk, dk1));
  EXPECT_TRUE(same_bits(dvv, dv1));
}

TEST(VarlenBackward, DeltaRuleIsOneCallPerSequenceInTheForwardsForm) {
  std::mt19937 rng(13);
  const int64_t T = kCu.back(), Hk = 1, Hv = 2, dk = 8, dv = 6;
  Tensor q = random_tensor({T, Hk, dk}, rng), k = random_tensor({T, Hk, dk}, rng);
  l2norm_forward(host_exec(), q, 1e-6f, 1.0f, q);
  l2norm_forward(host_exec(), k, 1e-6f, 1.0f, k);
  const Tensor v = random_tensor({T, Hv, dv}, rng),
               g = random_tensor({T, Hv, dk}, rng, -2.0f, 0.0f);
  const Tensor beta = random_tensor({T, Hv}, rng, 0.1f, 0.9f),
               d_out = random_tensor({T, Hv, dv}, rng);
  const float scale = 0.35f;
  for (const bool invariant : {false, true}) {
    Exec ex = host_exec();
    ex.batch_invariant = invariant;
    Tensor dq = Tensor::empty(q.shape()), dk_ = Tensor::empty(k.shape()),
           dv_ = Tensor::empty(v.shape()), dg = Tensor::empty(g.shape()),
           db = Tensor::empty(beta.shape());
    kda_varlen_backward(ex, q, k, v, g, beta, scale, offsets(kCu), kLongest, d_out, dq, dk_, dv_,
                        dg, db);
    Tensor dq1 = Tensor::empty(q.shape()), dk1 = Tensor::empty(k.shape()),
           dv1 = Tensor::empty(v.shape()), dg1 = Tensor::empty(g.shape()),
           db1 = Tensor::empty(beta.shape());
    const Tensor zero = Tensor::zeros({Hv, dk, dv});
    for (size_t s = 0; s + 1 < kCu.size(); ++s) {
      const int64_t b = kCu[s], e = kCu[s + 1];
      if (b == e) continue;
      const bool recurrence = kda_varlen_takes_recurrence(e - b, invariant);
      (recurrence ? kda_recurrent_backward : kda_chunked_backward)(
          ex, q.slice(0, b, e), k.slice(0, b, e), v.slice(0, b, e), g.slice(0, b, e),
          beta.slice(0, b, e), scale, zero, d_out.slice(0, b, e), Tensor(), dq1.slice(0, b, e),
          dk1.slice(0, b, e), dv1.slice(0, b, e), dg1.slice(0, b, e), db1.slice(0, b, e), Tensor());
    }
    EXPECT_TRUE(same_bits(dq, dq1)) << invariant;
    EXPECT_TRUE(same_bits(dk_, dk1)) << invariant;
    EXPECT_TRUE(same_bits(dv_, dv1)) << invariant;
    EXPECT_TRUE(same_bits(dg, dg1)) << invariant;
    EXPECT_TRUE(same_bits(db, db1)) << invariant;
  }
}

TEST(VarlenBackwardDeathTest, OffsetsMustCoverTheRowsWithinMaxSeqlen) {
  std::mt19937 rng(14);
  const int64_t T = 10, C = 3, W = 2;
  const Tensor x = random_tensor({T, C}, rng), w = random_tensor({C, W}, rng);
  Tensor dx = Tensor::empty({T, C}), dw = Tensor::zeros({C, W});
  EXPECT_DEATH(
      causal_conv1d_varlen_backward(host_exec(), x, w, offsets({0, 4, 9}), true, x, dx, dw),
      "causal_conv1d_varlen_backward: cu_seqlens runs from 0 to 9 over 10 rows");
  const Tensor q = random_tensor({T, 1, 4}, rng);
  Tensor out = Tensor::empty({T, 1, 4}), lse = Tensor::empty({T, 1});
  EXPECT_DEATH(
      causal_attention_varlen_forward(host_exec(), q, q, q, offsets({0, 3, 10}), 5, 1.0f, out, lse),
      "causal_attention_varlen_forward: sequence 1 is rows 3..10 \\(max_seqlen 5\\)");
}

}  // namespace
}  // namespace loom
