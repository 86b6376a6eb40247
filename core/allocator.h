// Host and device memory for tensors. Buffers are reference counted through shared_ptr so that
// views keep their storage alive; the deleter knows which allocator to return memory to.
#pragma once

#include <cstddef>
#include <memory>

#include "core/dtype.h"

namespace loom {

// Alignment of every host allocation: one cache line, and enough for AVX-512 loads.
inline constexpr size_t kHostAlignment = 64;

// Allocates `bytes` on `device`; aborts on exhaustion (callers size pools up front from a budget).
// Host memory is not zeroed.
std::shared_ptr<void> allocate_buffer(size_t bytes, Device device);

// Registers the CUDA allocator; called once by the CUDA backend's initialisation so that the core
// library does not link the CUDA runtime.
using DeviceAllocFn = void* (*)(size_t bytes);
using DeviceFreeFn = void (*)(void* ptr);
void set_device_allocator(DeviceAllocFn alloc, DeviceFreeFn free);

}  // namespace loom
