// HostCacheTier: blobs come back byte for byte, once, from host memory and from disk; the host
// budget moves the least recently stored unheld blobs to disk (or drops them), the disk budget
// drops the least recent files; a held blob is never moved out; a corrupt, truncated or missing
// file is reported lost, never returned; the keys the budgets drop are reported when asked; bad
// options are refused; files go with the tier.
#include "engine/model/host_cache_tier.h"

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace loom {
namespace {

std::vector<unsigned char> blob(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<unsigned char> b(n);
  for (unsigned char& c : b) c = static_cast<unsigned char>(rng());
  return b;
}

HostCacheTier::Info info_of(int32_t n) {
  return {.num_computed = n, .num_pages = n / 7, .has_slot = true};
}

bool put(HostCacheTier& t, uint64_t key, const std::vector<unsigned char>& b) {
  return t.put(key, info_of(static_cast<int32_t>(b.size())), b.size(),
               [&](void* dst) { std::memcpy(dst, b.data(), b.size()); });
}

// The blob under `key`, or nullopt when take() fails.
std::optional<std::vector<unsigned char>> take(HostCacheTier& t, uint64_t key, size_t n) {
  std::vector<unsigned char> out(n);
  if (!t.take(key, [&](const void* src) { std::memcpy(out.data(), src, n); })) return std::nullopt;
  return out;
}

std::string fresh_dir(const std::string& name) {
  const std::string dir = std::string(LOOM_TEST_TMPDIR) + "/host_cache_tier_" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

int files_in(const std::string& dir) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) n += e.is_regular_file();
  return n;
}

TEST(HostCacheTier, RoundTripOnceAndBudgetLru) {
  auto t = *HostCacheTier::create({.max_bytes = 1000}, host_exec());
  const auto a = blob(333, 1), b = blob(401, 2), c = blob(250, 3);
  ASSERT_TRUE(put(*t, 1, a));
  ASSERT_TRUE(put(*t, 2, b));
  EXPECT_EQ(t->stats().host_bytes, 734);
  EXPECT_EQ(t->hold(1)->num_computed, 333);
  t->release(1);
  // 734 + 333 > 1000: the least recently stored (1) goes, without a disk tier it is dropped.
  ASSERT_TRUE(put(*t, 3, a));
  EXPECT_FALSE(t->contains(1));
  EXPECT_EQ(t->stats().evicted, 1);
  EXPECT_EQ(take(*t, 2, b.size()), b);
  EXPECT_FALSE(take(*t, 2, b.size())) << "a blob comes back once";
  EXPECT_EQ(take(*t, 3, a.size()), a);
  EXPECT_EQ(t->stats().host_bytes, 0);
  EXPECT_EQ(t->stats().host_entries, 0);
  EXPECT_EQ(t->stats().restored, 2);
  // Larger than the budget: refused without calling fill.
  bool filled = false;
  EXPECT_FALSE(t->put(9, info_of(1001), 1001, [&](void*) { filled = true; }));
  EXPECT_FALSE(filled);
  // Replacing a key's blob frees the old one's bytes.
  ASSERT_TRUE(put(*t, 4, c));
  ASSERT_TRUE(put(*t, 4, b));
  EXPECT_EQ(t->stats().host_bytes, 401);
  EXPECT_EQ(take(*t, 4, b.size()), b);
}

TEST(HostCacheTier, HeldBlobStays) {
  auto t = *HostCacheTier::create({.max_bytes = 700}, host_exec());
  const auto a = blob(300, 4), b = blob(300, 5);
  ASSERT_TRUE(put(*t, 1, a));
  ASSERT_TRUE(put(*t, 2, b));
  ASSERT_TRUE(t->hold(1).has_value());
  EXPECT_FALSE(t->hold(77).has_value());
  ASSERT_TRUE(put(*t, 3, b));  // moves 2 out, not the held 1
  EXPECT_TRUE(t->contains(1));
  EXPECT_FALSE(t->contains(2));
  ASSERT_TRUE(t->hold(3).has_value());
  // Everything left is held: no room.
  EXPECT_FALSE(put(*t, 4, b));
  t->release(3);
  ASSERT_TRUE(put(*t, 4, b));
  EXPECT_FALSE(t->contains(3));
  EXPECT_EQ(take(*t, 1, a.size()), a);
  t->drop(4);
  EXPECT_EQ(t->stats().host_entries, 0);
}

TEST(HostCacheTier, DiskTierSpillsAndReadsBack) {
  const std::string dir = fresh_dir("spill");
  std::vector<std::vector<unsigned char>> blobs;
  for (int i = 0; i < 6; ++i) blobs.push_back(blob(129 + 61 * i, 10 + i));
  {
    // Host: 500 bytes; disk: 1200.
    auto t =
        *HostCacheTier::create({.max_bytes = 500, .dir = dir, .max_disk_bytes = 1200}, host_exec());
    for (int i = 0; i < 6; ++i) ASSERT_TRUE(put(*t, 100 + i, blobs[i])) << i;
    // Sizes 129 190 251 312 373 434: the host keeps the last (434), the others went to disk in
    // order; the fifth (373) passed 1200 there, which dropped the oldest file (129).
    const HostCacheTier::Stats& st = t->stats();
    EXPECT_EQ(st.host_entries, 1);
    EXPECT_EQ(st.host_bytes, 434);
    EXPECT_EQ(st.spilled, 5);
    EXPECT_EQ(st.disk_entries, 4);
    EXPECT_EQ(st.disk_bytes, 190 + 251 + 312 + 373);
    EXPECT_EQ(st.evicted, 1);
    EXPECT_EQ(files_in(dir), 4);
    EXPECT_FALSE(t->contains(100));
    EXPECT_TRUE(t->path_of(105).empty());
    EXPECT_FALSE(t->path_of(101).empty());
    for (int i = 1; i < 6; ++i) EXPECT_EQ(take(*t, 100 + i, blobs[i].size()), blobs[i]) << i;
    EXPECT_EQ(files_in(dir), 0);
    EXPECT_EQ(t->stats().disk_bytes, 0);
    EXPECT_EQ(t->stats().restored, 5);
    ASSERT_TRUE(put(*t, 1, blobs[4]));
    ASSERT_TRUE(put(*t, 2, blobs[0]));  // 1 goes to disk
    EXPECT_EQ(files_in(dir), 1);
    // Larger than host memory: straight to disk.
    const auto big = blob(777, 30);
    ASSERT_TRUE(put(*t, 3, big));
    EXPECT_FALSE(t->path_of(3).empty());
    EXPECT_EQ(t->stats().host_bytes, 129);
    EXPECT_EQ(files_in(dir), 2);
    EXPECT_EQ(take(*t, 3, big.size()), big);
  }
  EXPECT_EQ(files_in(dir), 0) << "the tier removes its files";
}

TEST(HostCacheTier, CorruptTruncatedOrMissingFileIsLost) {
  const std::string dir = fresh_dir("corrupt");
  auto t = *HostCacheTier::create({.max_bytes = 300, .dir = dir}, host_exec());
  const auto a = blob(200, 20), b = blob(200, 21), c = blob(200, 22), d = blob(200, 23);
  ASSERT_TRUE(put(*t, 1, a));
  ASSERT_TRUE(put(*t, 2, b));  // 1 to disk
  ASSERT_TRUE(put(*t, 3, c));  // 2 to disk
  ASSERT_TRUE(put(*t, 4, d));  // 3 to disk
  {                            // 1: a flipped byte in the data
    std::fstream f(t->path_of(1), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(32 + 57);
    const char x = 0x5a;
    f.write(&x, 1);
  }
  std::filesystem::resize_file(t->path_of(2), 32 + 150);  // 2: cut short
  std::filesystem::remove(t->path_of(3));                 // 3: gone
  bool read = false;
  for (uint64_t k : {1, 2, 3}) EXPECT_FALSE(t->take(k, [&](const void*) { read = true; })) << k;
  EXPECT_FALSE(read) << "a bad file's bytes never reach the reader";
  EXPECT_EQ(t->stats().lost, 3);
  EXPECT_EQ(t->stats().disk_entries, 0);
  EXPECT_EQ(take(*t, 4, d.size()), d);
}

// report_evictions: the keys the budgets drop come back once from take_evicted(); a take(), a
// drop() or a clear() is not an eviction. Without the option nothing is kept.
TEST(HostCacheTier, ReportsTheKeysItsBudgetsDrop) {
  auto t = *HostCacheTier::create({.max_bytes = 1000, .report_evictions = true}, host_exec());
  ASSERT_TRUE(put(*t, 1, blob(400, 1)));
  ASSERT_TRUE(put(*t, 2, blob(400, 2)));
  ASSERT_TRUE(take(*t, 2, 400).has_value());
  ASSERT_TRUE(put(*t, 3, blob(400, 3)));
  t->drop(3);
  EXPECT_TRUE(t->take_evicted().empty());
  ASSERT_TRUE(put(*t, 4, blob(400, 4)));
  ASSERT_TRUE(put(*t, 5, blob(400, 5)));  // 1 goes
  ASSERT_TRUE(put(*t, 6, blob(900, 6)));  // 4 and 5 go
  EXPECT_EQ(t->take_evicted(), (std::vector<uint64_t>{1, 4, 5}));
  EXPECT_TRUE(t->take_evicted().empty()) << "each key once";
  EXPECT_EQ(t->stats().evicted, 3);

  auto quiet = *HostCacheTier::create({.max_bytes = 500}, host_exec());
  ASSERT_TRUE(put(*quiet, 1, blob(400, 1)));
  ASSERT_TRUE(put(*quiet, 2, blob(400, 2)));
  EXPECT_EQ(quiet->stats().evicted, 1);
  EXPECT_TRUE(quiet->take_evicted().empty());
}

TEST(HostCacheTier, RefusesBadOptions) {
  EXPECT_EQ(HostCacheTier::create({.max_bytes = 0}, host_exec()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      HostCacheTier::create({.max_bytes = 10, .max_disk_bytes = -1}, host_exec()).status().code(),
      absl::StatusCode::kInvalidArgument);
  const std::string file = std::string(LOOM_TEST_TMPDIR) + "/host_cache_tier_not_a_dir";
  std::ofstream(file) << "x";
  auto bad = HostCacheTier::create({.max_bytes = 10, .dir = file + "/sub"}, host_exec());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("cannot be written"), std::string::npos);
}

}  // namespace
}  // namespace loom
