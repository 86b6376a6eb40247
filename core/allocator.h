// Host and device memory for tensors. Buffers are reference counted through shared_ptr so that
// views keep their storage alive; the deleter knows which allocator to return memory to.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/dtype.h"

namespace loom {

// Alignment of every host allocation: one cache line, and enough for AVX-512 loads.
inline constexpr size_t kHostAlignment = 64;

// Allocates `bytes` on `device`; aborts on exhaustion (callers size pools up front from a budget).
// Host memory is not zeroed.
std::shared_ptr<void> allocate_buffer(size_t bytes, Device device);

// Number of allocate_buffer calls so far (all devices, all threads). Tests use it to prove that
// the per-step path allocates nothing once warm.
uint64_t allocation_count();

// Registers the CUDA allocator; called once by the CUDA backend's initialisation so that the core
// library does not link the CUDA runtime.
using DeviceAllocFn = void* (*)(size_t bytes, int device_index);
using DeviceFreeFn = void (*)(void* ptr, int device_index);
void set_device_allocator(DeviceAllocFn alloc, DeviceFreeFn free);

// Copies `bytes` between any two devices (host<->GPU, GPU<->GPU), registered by the CUDA backend
// like the allocator. Synchronous: the data is in place when the call returns, so host memory on
// either side may be reused at once. For tools, loads and tests; per-step transfers use the
// backend's asynchronous copies on the step's stream instead.
// Page-locked host memory (cudaHostAlloc), registered by the CUDA backend like the allocator: the
// host side of asynchronous copies with a device (cache offload), which pageable memory would
// turn into staged, synchronous ones.
using PinnedAllocFn = void* (*)(size_t bytes);
using PinnedFreeFn = void (*)(void* ptr);
void set_pinned_host_allocator(PinnedAllocFn alloc, PinnedFreeFn free);
// `bytes` of host memory for transfers with `peer`: page-locked when `peer` is a CUDA device
// (its backend must be initialised, device_available), plain aligned host memory when it is the
// host, whose copies are memcpy. Not zeroed; aborts on exhaustion. Releasing the last reference
// does not wait for the device: the CUDA backend recycles page-locked blocks
// (core/pinned_block_cache.h), so drop a buffer only once the copies into or out of it have
// finished (synchronize the stream they were enqueued on).
std::shared_ptr<void> allocate_transfer_buffer(size_t bytes, Device peer);

using DeviceCopyFn = void (*)(void* dst, Device dst_device, const void* src, Device src_device,
                              size_t bytes);
void set_device_copier(DeviceCopyFn copy);
// memcpy on the host; the registered copier when either side is a device (aborts if none is).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);

}  // namespace loom
