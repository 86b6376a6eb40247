// kernels/cache_ops.h against a per-slot reference on random data: the named slots, pages and
// rows change exactly as a plain element loop says, every other byte of both pools stays as it
// was; odd sizes, f32 and 16-bit pools; contract violations abort.
#include "kernels/cache_ops.h"

#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace loom {
namespace {

// A pool of random bytes (any dtype: the ops move bytes, so random bit patterns are fine).
Tensor random_pool(Shape shape, DType dtype, std::mt19937& rng) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* b = static_cast<unsigned char*>(t.raw());
  for (size_t i = 0; i < t.nbytes(); ++i) b[i] = static_cast<unsigned char>(rng());
  return t;
}

std::vector<unsigned char> bytes_of(const Tensor& t) {
  const auto* b = static_cast<const unsigned char*>(t.raw());
  return {b, b + t.nbytes()};
}

// Bytes per element of a pool.
size_t es(const Tensor& t) { return dtype_size(t.dtype()); }

TEST(CacheOps, ZeroSlotsTouchesOnlyTheRange) {
  std::mt19937 rng(1);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (auto [begin, end] :
         std::vector<std::pair<int64_t, int64_t>>{{0, 7}, {3, 4}, {2, 5}, {6, 7}, {4, 4}}) {
      Tensor pool = random_pool({7, 3, 5}, dt, rng);  // 7 slots of 15 elements
      std::vector<unsigned char> want = bytes_of(pool);
      const size_t item = 15 * es(pool);
      for (int64_t s = begin; s < end; ++s)
        std::memset(want.data() + s * item, 0, item);  // the per-slot reference
      cache_zero_slots(host_exec(), pool, begin, end);
      EXPECT_EQ(bytes_of(pool), want) << dtype_name(dt) << " [" << begin << ", " << end << ")";
    }
  }
}

TEST(CacheOps, CopySlotBetweenAndWithinPools) {
  std::mt19937 rng(2);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    // 5 slots of [3, 7] into a pool of 4 slots of the same items.
    Tensor src = random_pool({5, 3, 7}, dt, rng);
    Tensor dst = random_pool({4, 3, 7}, dt, rng);
    const std::vector<unsigned char> src_before = bytes_of(src);
    std::vector<unsigned char> want = bytes_of(dst);
    const size_t item = 21 * es(src);
    for (auto [a, b] : std::vector<std::pair<int64_t, int64_t>>{{4, 0}, {1, 3}, {1, 2}}) {
      std::memcpy(want.data() + b * item, src_before.data() + a * item, item);
      cache_copy_slot(host_exec(), src, a, dst, b);
      EXPECT_EQ(bytes_of(dst), want) << dtype_name(dt) << " " << a << " -> " << b;
      EXPECT_EQ(bytes_of(src), src_before);  // the source is read only
    }
    // Within one pool (a checkpoint save); a slot onto itself changes nothing.
    std::vector<unsigned char> self = bytes_of(src);
    std::memcpy(self.data() + 0 * item, src_before.data() + 3 * item, item);
    cache_copy_slot(host_exec(), src, 3, src, 0);
    cache_copy_slot(host_exec(), src, 2, src, 2);
    EXPECT_EQ(bytes_of(src), self);
  }
}

TEST(CacheOps, CopyPageRowsBetweenPageSizes) {
  std::mt19937 rng(3);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    // Pages of 5 rows into pages of 9 rows (a private cache growing), rows of [2, 3].
    Tensor src = random_pool({3, 5, 2, 3}, dt, rng);
    Tensor dst = random_pool({4, 9, 2, 3}, dt, rng);
    const std::vector<unsigned char> src_before = bytes_of(src);
    std::vector<unsigned char> want = bytes_of(dst);
    const size_t row = 6 * es(src);
    struct Case {
      int64_t sp, dp, r0, r1;
    };
    for (const Case& c : {Case{2, 3, 0, 5}, Case{0, 1, 1, 4}, Case{1, 0, 4, 5}, Case{1, 2, 3, 3}}) {
      for (int64_t r = c.r0; r < c.r1; ++r)
        std::memcpy(want.data() + (c.dp * 9 + r) * row, src_before.data() + (c.sp * 5 + r) * row,
                    row);
      cache_copy_page_rows(host_exec(), src, c.sp, dst, c.dp, c.r0, c.r1);
      EXPECT_EQ(bytes_of(dst), want) << dtype_name(dt) << " page " << c.sp << " -> " << c.dp
                                     << " rows [" << c.r0 << ", " << c.r1 << ")";
      EXPECT_EQ(bytes_of(src), src_before);
    }
    // An empty range names no page: ids outside both pools are fine.
    cache_copy_page_rows(host_exec(), src, 99, dst, -1, 2, 2);
    EXPECT_EQ(bytes_of(dst), want);
  }
}

TEST(CacheOpsDeathTest, ContractsAbort) {
  std::mt19937 rng(4);
  Tensor a = random_pool({4, 3, 5}, DType::kF32, rng);
  Tensor b = random_pool({4, 3, 6}, DType::kF32, rng);
  Tensor h = random_pool({4, 3, 5}, DType::kBF16, rng);
  EXPECT_DEATH(cache_zero_slots(host_exec(), a, 2, 5), "outside");
  EXPECT_DEATH(cache_zero_slots(host_exec(), a, 3, 2), "outside");
  EXPECT_DEATH(cache_copy_slot(host_exec(), a, 0, b, 1), "different items");
  EXPECT_DEATH(cache_copy_slot(host_exec(), a, 0, h, 1), "different items");
  EXPECT_DEATH(cache_copy_slot(host_exec(), a, 4, a, 1), "source slot 4 outside");
  EXPECT_DEATH(cache_copy_slot(host_exec(), a, 0, a, -1), "destination slot -1 outside");
  EXPECT_DEATH(cache_copy_page_rows(host_exec(), a, 0, a, 1, 0, 4), "do not fit");
  EXPECT_DEATH(cache_copy_page_rows(host_exec(), a, 0, a, 1, 2, 1), "rows");
  // Overlapping views of one buffer: the result would depend on the copy's order.
  Tensor shifted = a.reshape({60}).slice(0, 1, 60).slice(0, 0, 45).reshape({3, 3, 5});
  EXPECT_DEATH(cache_copy_slot(host_exec(), a, 0, shifted, 0), "overlap");
  EXPECT_DEATH(cache_zero_slots(host_exec(), a.slice(1, 0, 2), 0, 1), "contiguous");
}

}  // namespace
}  // namespace loom
