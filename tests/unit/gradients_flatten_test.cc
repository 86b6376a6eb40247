// Gradients::flatten (engine/model/gradients.h): the gradients move into one padded block in name
// order with their values kept, later get()s return views into it, zero() clears the block, a name
// first asked for afterwards lives on its own until the next flatten takes it in, and asking for
// another multiple rebuilds the padding.
#include "engine/model/gradients.h"
#include "gtest/gtest.h"
#include "kernels/elementwise.h"

namespace loom {
namespace {

void fill(const Tensor& t, float base) {
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = base + static_cast<float>(i);
}

TEST(GradientsFlatten, KeepsValuesInNameOrderAndPads) {
  Gradients g;
  fill(g.get("b", {2, 3}), 10.0f);
  fill(g.get("a", {5}), 0.0f);
  const Tensor& flat = g.flatten(4);  // 11 elements padded to 12
  ASSERT_EQ(flat.numel(), 12);
  const float want[] = {0, 1, 2, 3, 4, 10, 11, 12, 13, 14, 15, 0};  // "a" then "b", then padding
  for (int i = 0; i < 12; ++i) EXPECT_EQ(flat.data<float>()[i], want[i]) << i;
  // get() now hands out views: a write through it lands in the block.
  const Tensor& b = g.get("b", {2, 3});
  EXPECT_EQ(b.data<float>(), flat.data<float>() + 5);
  b.data<float>()[0] = -1.0f;
  EXPECT_EQ(flat.data<float>()[5], -1.0f);
  EXPECT_EQ(&g.flatten(4), &flat);  // nothing new: the same block
  g.zero();
  for (int i = 0; i < 12; ++i) EXPECT_EQ(flat.data<float>()[i], 0.0f) << i;
  EXPECT_EQ(g.find("a")->data<float>(), flat.data<float>());
}

TEST(GradientsFlatten, LateNamesAndOtherMultiples) {
  Gradients g;
  fill(g.get("x", {3}), 1.0f);
  g.flatten(1);
  fill(g.get("w", {2}), 7.0f);  // after flatten: its own tensor
  g.zero();                     // clears both the block and the late tensor
  EXPECT_EQ(g.find("x")->data<float>()[2], 0.0f);
  EXPECT_EQ(g.find("w")->data<float>()[1], 0.0f);
  fill(g.get("w", {2}), 7.0f);
  fill(g.get("x", {3}), 1.0f);
  const Tensor& flat = g.flatten(3);  // "w" (2) then "x" (3), padded to 6
  ASSERT_EQ(flat.numel(), 6);
  const float want[] = {7, 8, 1, 2, 3, 0};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(flat.data<float>()[i], want[i]) << i;
  EXPECT_EQ(g.flatten(2).numel(), 6);  // 5 elements padded to a multiple of 2
}

}  // namespace
}  // namespace loom
