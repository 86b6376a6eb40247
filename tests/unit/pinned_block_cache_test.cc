// PinnedBlockCache (core/pinned_block_cache.h) over a counting fake allocator: released blocks
// serve later requests that fit them (at least the size, less than twice it), sizes round to the
// granule, the free bytes stay under the cap (largest returned first), a failed allocation gives
// the free blocks back and retries, and destruction frees everything.
#include "core/pinned_block_cache.h"

#include <cstdlib>
#include <set>

#include "gtest/gtest.h"

namespace loom {
namespace {

constexpr size_t kG = PinnedBlockCache::kGranule;

std::set<void*> g_live;
int g_fail_next = 0;  // how many upcoming allocations fail

void* fake_alloc(size_t bytes) {
  if (g_fail_next > 0) {
    --g_fail_next;
    return nullptr;
  }
  void* p = std::malloc(bytes);
  g_live.insert(p);
  return p;
}
void fake_free(void* p) {
  ASSERT_EQ(g_live.erase(p), 1u) << "freed a block twice or one never allocated";
  std::free(p);
}

class PinnedBlockCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    g_live.clear();
    g_fail_next = 0;
  }
  void TearDown() override { EXPECT_TRUE(g_live.empty()) << g_live.size() << " blocks leaked"; }
};

TEST_F(PinnedBlockCacheTest, ReleasedBlockServesAFittingRequest) {
  PinnedBlockCache c(fake_alloc, fake_free, 64 * kG);
  void* a = c.allocate(3 * kG + 5);  // rounds to 4 granules
  c.release(a);
  EXPECT_EQ(c.stats().free_bytes, 4 * kG);
  void* b = c.allocate(4 * kG);  // fits exactly
  EXPECT_EQ(b, a);
  EXPECT_EQ(c.stats().reuses, 1u);
  EXPECT_EQ(c.stats().system_allocations, 1u);
  c.release(b);
  void* small = c.allocate(kG);  // a 4-granule block is at least twice 1: not reused
  EXPECT_NE(small, a);
  void* big = c.allocate(5 * kG);  // larger than every free block
  EXPECT_NE(big, a);
  EXPECT_EQ(c.stats().system_allocations, 3u);
  c.release(small);
  c.release(big);
  EXPECT_EQ(c.stats().used_bytes, 0u);
}

TEST_F(PinnedBlockCacheTest, FreeBytesStayUnderTheCapLargestFirst) {
  PinnedBlockCache c(fake_alloc, fake_free, 5 * kG);
  void* a = c.allocate(kG);
  void* b = c.allocate(2 * kG);
  void* d = c.allocate(4 * kG);
  c.release(a);
  c.release(b);
  EXPECT_EQ(c.stats().free_bytes, 3 * kG);
  c.release(d);  // 7 granules free > 5: the 4-granule block goes back
  EXPECT_EQ(c.stats().free_bytes, 3 * kG);
  EXPECT_EQ(g_live.size(), 2u);
  EXPECT_EQ(c.allocate(2 * kG), b);
  EXPECT_EQ(c.allocate(kG), a);
  c.release(a);
  c.release(b);
}

TEST_F(PinnedBlockCacheTest, ZeroCapKeepsNothing) {
  PinnedBlockCache c(fake_alloc, fake_free, 0);
  c.release(c.allocate(kG));
  EXPECT_TRUE(g_live.empty());
  EXPECT_EQ(c.stats().free_bytes, 0u);
}

TEST_F(PinnedBlockCacheTest, FailedAllocationReturnsFreeBlocksAndRetries) {
  PinnedBlockCache c(fake_alloc, fake_free, 64 * kG);
  c.release(c.allocate(kG));
  EXPECT_EQ(g_live.size(), 1u);
  g_fail_next = 1;
  void* p = c.allocate(8 * kG);  // no free block fits; the first try fails
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(g_live.size(), 1u) << "the free block went back before the retry";
  EXPECT_EQ(c.stats().free_bytes, 0u);
  g_fail_next = 2;
  EXPECT_EQ(c.allocate(kG), nullptr);
  c.release(p);
}

TEST_F(PinnedBlockCacheTest, DestructionFreesEverything) {
  {
    PinnedBlockCache c(fake_alloc, fake_free, 64 * kG);
    void* a = c.allocate(kG);
    c.allocate(kG);  // still used at destruction: freed too
    c.release(a);
  }
  EXPECT_TRUE(g_live.empty());
}

}  // namespace
}  // namespace loom
