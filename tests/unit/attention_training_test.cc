// The attention tail of training (engine/model/attention_training.h): a training forward records
// the attention outputs and log-sum-exps on its tape, and the backward takes them from there
// (ForwardContext::kept) instead of running the attention forward again; without them, or with
// records of another shape, it computes them.
#include "engine/model/attention_training.h"

#include <cstring>
#include <random>

#include "engine/model/activation_tape.h"
#include "gtest/gtest.h"

namespace loom {
namespace {

Tensor randn(Shape shape, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Tensor t = Tensor::empty(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = normal(rng);
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

TEST(AttentionTraining, TheBackwardTakesTheForwardsRecordedOutputs) {
  std::mt19937 rng(11);
  const int64_t n = 37, h = 2, d = 8, dm = 16;
  const Tensor q = randn({n, h, d}, rng), k = randn({n, h, d}, rng), v = randn({n, h, d}, rng);
  const Tensor x = randn({n, dm}, rng), gate_proj = randn({h * d, dm}, rng);
  BatchLayout layout;
  layout.cu_seqlens = Tensor::empty({3}, DType::kI64);
  const int64_t cu[] = {0, 20, n};
  std::memcpy(layout.cu_seqlens.raw(), cu, sizeof(cu));
  layout.num_rows = n;
  layout.max_seqlen = 20;
  Workspace ws(Device::kCpu);
  Exec ex;
  ex.workspace = &ws;
  const float scale = 0.35f;

  // The forward: computes and records under its layer.
  ActivationTape tape;
  const ForwardContext forward{ex, layout, DType::kF32, &tape, nullptr, /*training=*/true};
  const AttentionTail computed = attention_tail_recompute(forward, 3, q, k, v, scale, x, gate_proj);
  const Tensor* o = tape.find(3, kAttentionOut);
  const Tensor* lse = tape.find(3, kAttentionLse);
  ASSERT_NE(o, nullptr);
  ASSERT_NE(lse, nullptr);
  EXPECT_TRUE(same_bits(*o, computed.o));
  EXPECT_TRUE(same_bits(*lse, computed.lse));

  // The backward: the records themselves, and the same gate and o_proj input.
  const ForwardContext backward{ex, layout, DType::kF32, nullptr, nullptr, true, &tape};
  const AttentionTail kept = attention_tail_recompute(backward, 3, q, k, v, scale, x, gate_proj);
  EXPECT_EQ(kept.o.raw(), o->raw());
  EXPECT_EQ(kept.lse.raw(), lse->raw());
  EXPECT_TRUE(same_bits(kept.y, computed.y));
  EXPECT_TRUE(same_bits(kept.gate, computed.gate));

  // Taken, not recomputed: altered records come back altered.
  std::memset(o->raw(), 0, o->nbytes());
  const AttentionTail altered = attention_tail_recompute(backward, 3, q, k, v, scale, x, gate_proj);
  EXPECT_EQ(altered.o.data<float>()[5], 0.0f);

  // Another layer has no records, and records of another shape are not taken: both compute.
  const AttentionTail other = attention_tail_recompute(backward, 4, q, k, v, scale, x, gate_proj);
  EXPECT_TRUE(same_bits(other.o, computed.o));
  BatchLayout first;  // the first sequence alone
  first.cu_seqlens = Tensor::empty({2}, DType::kI64);
  const int64_t cu_first[] = {0, 20};
  std::memcpy(first.cu_seqlens.raw(), cu_first, sizeof(cu_first));
  first.num_rows = 20;
  first.max_seqlen = 20;
  const ForwardContext backward_first{ex, first, DType::kF32, nullptr, nullptr, true, &tape};
  const AttentionTail fewer =
      attention_tail_recompute(backward_first, 3, q.slice(0, 0, 20), k.slice(0, 0, 20),
                               v.slice(0, 0, 20), scale, x.slice(0, 0, 20), gate_proj);
  EXPECT_NE(fewer.o.raw(), o->raw());
  EXPECT_TRUE(same_bits(fewer.o, computed.o.slice(0, 0, 20).clone()));
}

}  // namespace
}  // namespace loom
