// CUDA backend: device memory, the stream, and host<->device copies.
//
// loom::cuda::init() registers cudaMalloc/cudaFree with loom::set_device_allocator, so that
// Tensor::empty(shape, dtype, Device::kCuda) works; it is idempotent and thread-safe, and
// to_device() calls it. Every Loom CUDA kernel, copy and cuBLAS call runs on current_stream().
#pragma once

#include <cstddef>

#include "core/tensor.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.h"

namespace loom::cuda {

void init();

// Blocks until all work enqueued on current_stream() has finished (checks for errors).
void synchronize();

// Contiguous copies of a host tensor on the GPU and back (same shape and dtype). Both enqueue on
// current_stream(); to_host() waits for the copy, so its result is ready on return.
Tensor to_device(const Tensor& host);
Tensor to_host(const Tensor& dev);

// A stream-ordered temporary device buffer (cudaMallocAsync / cudaFreeAsync on current_stream()),
// for small uploads such as index lists; freeing it never synchronises the device.
class Scratch {
 public:
  explicit Scratch(size_t bytes);
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* get() const { return ptr_; }
  // Copies `bytes` from host memory (pageable is fine: the call returns once it was staged).
  void upload(const void* host, size_t bytes);

 private:
  void* ptr_ = nullptr;
};

}  // namespace loom::cuda
