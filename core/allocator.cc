#include "core/allocator.h"

#include <atomic>
#include <cstdlib>

#include "core/status.h"

namespace loom {
namespace {
DeviceAllocFn g_device_alloc = nullptr;
DeviceFreeFn g_device_free = nullptr;
std::atomic<uint64_t> g_allocations{0};
}  // namespace

void set_device_allocator(DeviceAllocFn alloc, DeviceFreeFn free) {
  g_device_alloc = alloc;
  g_device_free = free;
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
