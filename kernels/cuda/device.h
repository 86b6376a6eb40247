// CUDA backend: device memory and host<->device copies.
//
// loom::cuda::init() registers cudaMalloc/cudaFree with loom::set_device_allocator, so that
// Tensor::empty(shape, dtype, Device::cuda(i)) works; it is idempotent and thread-safe, and
// device_context() and to_device() call it. Copies run on the stream of the device's context
// (kernels/cuda/context.h), in order with the ops of every Exec of that device.
#pragma once

#include <cstddef>

#include "core/tensor.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/launch.h"

namespace loom::cuda {

void init();
// CUDA devices this process can use (0 when there is no driver or no device): never aborts, so a
// caller can refuse a --device flag with a message.
int visible_devices();
// Free and total bytes of device `index` now (cudaMemGetInfo on that device).
void memory_info(int index, size_t* free_bytes, size_t* total_bytes);

// Blocks until all work enqueued on the stream of `device`'s context has finished (checks for
// errors).
void synchronize(Device device = Device::kCuda);

// Contiguous copies of a host tensor on a GPU and back (same shape and dtype). Both enqueue on the
// stream of the device's context; to_host() waits for the copy, so its result is ready on return.
Tensor to_device(const Tensor& host, Device device = Device::kCuda);
Tensor to_host(const Tensor& dev);

// A stream-ordered temporary device buffer (cudaMallocAsync / cudaFreeAsync on `stream`), for
// small uploads such as index lists; freeing it never synchronises the device.
class Scratch {
 public:
  Scratch(size_t bytes, cudaStream_t stream);
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* get() const { return ptr_; }
  // Copies `bytes` from host memory (pageable is fine: the call returns once it was staged).
  void upload(const void* host, size_t bytes);

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

}  // namespace loom::cuda
