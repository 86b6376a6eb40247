#include "core/allocator.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/status.h"

namespace loom {
namespace {
DeviceAllocFn g_device_alloc = nullptr;
DeviceFreeFn g_device_free = nullptr;
DeviceCopyFn g_device_copy = nullptr;
PinnedAllocFn g_pinned_alloc = nullptr;
PinnedFreeFn g_pinned_free = nullptr;
std::atomic<uint64_t> g_allocations{0};
}  // namespace

void set_device_allocator(DeviceAllocFn alloc, DeviceFreeFn free) {
  g_device_alloc = alloc;
  g_device_free = free;
}

void set_device_copier(DeviceCopyFn copy) { g_device_copy = copy; }

void set_pinned_host_allocator(PinnedAllocFn alloc, PinnedFreeFn free) {
  g_pinned_alloc = alloc;
  g_pinned_free = free;
}

std::shared_ptr<void> allocate_transfer_buffer(size_t bytes, Device peer) {
  if (peer.is_cpu()) return allocate_buffer(bytes, Device::kCpu);
  LOOM_CHECK(g_pinned_alloc != nullptr,
             "pinned host allocator not registered (no CUDA backend initialised for %s)",
             device_name(peer).c_str());
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  void* p = g_pinned_alloc(bytes == 0 ? kHostAlignment : bytes);
  LOOM_CHECK(p != nullptr, "pinned host allocation of %zu bytes failed", bytes);
  PinnedFreeFn free_fn = g_pinned_free;
  return std::shared_ptr<void>(p, [free_fn](void* q) { free_fn(q); });
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
  LOOM_CHECK(g_device_copy != nullptr, "copy %s -> %s: no CUDA backend linked",
             device_name(src_device).c_str(), device_name(dst_device).c_str());
  g_device_copy(dst, dst_device, src, src_device, bytes);
}

uint64_t allocation_count() { return g_allocations.load(std::memory_order_relaxed); }

std::shared_ptr<void> allocate_buffer(size_t bytes, Device device) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  const size_t rounded = (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
  if (device.is_cpu()) {
    void* p = std::aligned_alloc(kHostAlignment, rounded == 0 ? kHostAlignment : rounded);
    LOOM_CHECK(p != nullptr, "host allocation of %zu bytes failed", bytes);
    return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  }
  LOOM_CHECK(g_device_alloc != nullptr, "CUDA allocator not registered (no CUDA backend linked)");
  const int index = device.index;
  void* p = g_device_alloc(rounded == 0 ? kHostAlignment : rounded, index);
  LOOM_CHECK(p != nullptr, "allocation of %zu bytes on %s failed", bytes,
             device_name(device).c_str());
  DeviceFreeFn free_fn = g_device_free;
  return std::shared_ptr<void>(p, [free_fn, index](void* q) { free_fn(q, index); });
}

}  // namespace loom
