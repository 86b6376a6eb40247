#include "core/allocator.h"

#include <cstdlib>

#include "core/status.h"

namespace loom {
namespace {
DeviceAllocFn g_device_alloc = nullptr;
DeviceFreeFn g_device_free = nullptr;
}  // namespace

void set_device_allocator(DeviceAllocFn alloc, DeviceFreeFn free) {
  g_device_alloc = alloc;
  g_device_free = free;
}

std::shared_ptr<void> allocate_buffer(size_t bytes, Device device) {
  const size_t rounded = (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
  if (device == Device::kCpu) {
    void* p = std::aligned_alloc(kHostAlignment, rounded == 0 ? kHostAlignment : rounded);
    LOOM_CHECK(p != nullptr, "host allocation of %zu bytes failed", bytes);
    return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  }
  LOOM_CHECK(g_device_alloc != nullptr, "CUDA allocator not registered (no CUDA backend linked)");
  void* p = g_device_alloc(rounded == 0 ? kHostAlignment : rounded);
  LOOM_CHECK(p != nullptr, "device allocation of %zu bytes failed", bytes);
  DeviceFreeFn free_fn = g_device_free;
  return std::shared_ptr<void>(p, [free_fn](void* q) { free_fn(q); });
}

}  // namespace loom
