// HostCacheTier on a GPU stream (engine/model/host_cache_tier.h): the tier never synchronises the
// stream, so these tests queue its copies behind ~ms of device work and then do, on the host at
// once, what would break if a blob were freed or reused early:
//  - take(): the copies out of a blob are still queued when take() returns; a put() of the same
//    size right after must not get that blob's page-locked block (core/pinned_block_cache.h hands
//    freed blocks to the next allocation), or its host-side fill would overwrite the bytes the
//    queued copy has yet to read;
//  - drop() / eviction by the budget: the copies into a blob are still queued; freeing it waits
//    for them, so a reused block's new contents are never overwritten by the old blob's copy.
// Each checks the device bytes after synchronising: the originals, never the later pattern.
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "engine/model/host_cache_tier.h"
#include "gtest/gtest.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/device.h"
#include "kernels/exec.h"

namespace loom {
namespace {

constexpr size_t kBlob = size_t{8} << 20;   // bytes a blob (a few pages' worth)
constexpr size_t kDelay = size_t{1} << 30;  // a device-to-device copy queued before the tier's

class HostTierCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::visible_devices() == 0) GTEST_SKIP() << "no CUDA device";
    cuda::init();
    ex_ = cuda::device_exec(0);
    delay_a_ = Tensor::empty({static_cast<int64_t>(kDelay)}, DType::kU8, Device::kCuda);
    delay_b_ = Tensor::empty({static_cast<int64_t>(kDelay)}, DType::kU8, Device::kCuda);
  }
  // ~0.5 ms of copy engine work ahead of whatever is enqueued next.
  void delay_stream() {
    for (int i = 0; i < 2; ++i) copy_async(ex_, delay_b_.raw(), delay_a_.raw(), kDelay);
  }
  Tensor device_bytes(uint8_t value) {
    std::vector<uint8_t> h(kBlob, value);
    Tensor d = Tensor::empty({static_cast<int64_t>(kBlob)}, DType::kU8, Device::kCuda);
    upload_async(ex_, d.raw(), h.data(), kBlob);  // staged: h may go at once
    synchronize(ex_);
    return d;
  }
  std::unique_ptr<HostCacheTier> tier(int64_t budget) {
    HostCacheTier::Options o;
    o.max_bytes = budget;
    auto t = HostCacheTier::create(o, ex_);
    EXPECT_TRUE(t.ok()) << t.status();
    return std::move(*t);
  }

  Exec ex_;
  Tensor delay_a_, delay_b_;
};

int64_t bytes_not(const Tensor& d, uint8_t value) {
  const Tensor h = cuda::to_host(d);
  const uint8_t* p = static_cast<const uint8_t*>(h.raw());
  int64_t n = 0;
  for (size_t i = 0; i < h.nbytes(); ++i) n += p[i] != value;
  return n;
}

// take()'s copies out of the blob run after the delay; a put() of the same size right after it
// fills a fresh blob on the host at once: the device must still receive the taken blob's bytes.
TEST_F(HostTierCuda, TakenBlobIsNotReusedBeforeItsCopiesRun) {
  auto t = tier(int64_t{64} << 20);
  const Tensor src = device_bytes(0x5a);
  ASSERT_TRUE(t->put(1, {}, kBlob, [&](void* dst) {
    const void* s = src.raw();
    size_t n = kBlob;
    copy_batch_async(ex_, &dst, &s, &n, 1);
  }));
  synchronize(ex_);
  const Tensor dst = device_bytes(0x00);
  for (int round = 0; round < 8; ++round) {
    delay_stream();
    ASSERT_TRUE(t->take(1 + round, [&](const void* blob) {
      void* d = dst.raw();
      size_t n = kBlob;
      copy_batch_async(ex_, &d, &blob, &n, 1);
    }));
    // The next blob: filled on the host at once (the bytes the device must never see).
    ASSERT_TRUE(t->put(2 + round, {}, kBlob, [](void* b) { std::memset(b, 0xee, kBlob); }));
    synchronize(ex_);
    EXPECT_EQ(bytes_not(dst, 0x5a), 0) << "round " << round;
    // Round r + 1 takes blob 2 + r: its bytes become the originals again (put replaces).
    ASSERT_TRUE(t->put(2 + round, {}, kBlob, [](void* b) { std::memset(b, 0x5a, kBlob); }));
  }
}

// A dropped or evicted blob whose device-to-host fill is still queued is freed only after it: a
// block reused by the next put() keeps the next put's bytes.
TEST_F(HostTierCuda, DroppedAndEvictedBlobsWaitForTheirFill) {
  const Tensor src = device_bytes(0x33);
  for (const bool evict : {false, true}) {
    auto t = tier(evict ? static_cast<int64_t>(kBlob) : int64_t{64} << 20);
    delay_stream();
    ASSERT_TRUE(t->put(1, {}, kBlob, [&](void* dst) {
      const void* s = src.raw();
      size_t n = kBlob;
      copy_batch_async(ex_, &dst, &s, &n, 1);
    }));
    if (!evict) t->drop(1);
    // Evict: the budget holds one blob, so this put drops blob 1 to make room.
    ASSERT_TRUE(t->put(2, {}, kBlob, [](void* b) { std::memset(b, 0x77, kBlob); }));
    synchronize(ex_);
    const Tensor got = device_bytes(0x00);
    ASSERT_TRUE(t->take(2, [&](const void* blob) {
      void* d = got.raw();
      size_t n = kBlob;
      copy_batch_async(ex_, &d, &blob, &n, 1);
    }));
    synchronize(ex_);
    EXPECT_EQ(bytes_not(got, 0x77), 0) << (evict ? "evicted" : "dropped");
    EXPECT_EQ(t->stats().evicted, evict ? 1 : 0);
  }
}

}  // namespace
}  // namespace loom
