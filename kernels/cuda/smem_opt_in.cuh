// The opt-in to more than 48 KiB of dynamic shared memory, once per kernel and device.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace loom::cuda {

inline int current_device() {
  int device = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

// cudaFuncSetAttribute acts on the current device only, so a process that launches on two
// devices must raise the limit on each: bit d of `done` records device d. `done` is one per
// kernel instantiation (a function-local static beside the launch).
template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes, std::atomic<uint64_t>& done) {
  const uint64_t bit = uint64_t{1} << (current_device() & 63);
  if ((done.load(std::memory_order_acquire) & bit) != 0) return;
  LOOM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(bytes)));
  done.fetch_or(bit, std::memory_order_acq_rel);
}

}  // namespace loom::cuda
