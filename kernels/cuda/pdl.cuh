// Device side of programmatic dependent launch (kernels/cuda/pdl.h says when a kernel may use it).
#pragma once

#include <cstdint>

namespace loom::cuda::dev {

// Holds the calling thread until the kernels this grid programmatically depends on have finished
// and their writes are visible; returns at once in a launch without such a dependency.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Asks the copy engine of the SM (TMA) to pull [p, p + bytes) into L2 without waiting for it and
// without using registers. p 16-byte aligned, bytes a multiple of 16.
__device__ __forceinline__ void prefetch_l2(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}

}  // namespace loom::cuda::dev
