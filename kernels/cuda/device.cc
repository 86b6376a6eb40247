#include "kernels/cuda/device.h"

#include <mutex>
#include <string>

#include "core/allocator.h"

namespace loom::cuda {
namespace {

void* device_alloc(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    std::fprintf(stderr, "cudaMalloc of %zu bytes failed: %s\n", bytes, cudaGetErrorString(e));
    (void)cudaGetLastError();  // clear the sticky-free error so the caller's check reports it
    return nullptr;            // allocate_buffer aborts with the size
  }
  return p;
}

void device_free(void* p) { LOOM_CUDA_CHECK(cudaFree(p)); }

}  // namespace

void init() {
  static std::once_flag once;
  std::call_once(once, [] {
    int count = 0;
    LOOM_CUDA_CHECK(cudaGetDeviceCount(&count));
    LOOM_CHECK(count > 0, "loom::cuda::init: no CUDA device");
    set_device_allocator(&device_alloc, &device_free);
    (void)current_stream();
  });
}

cudaStream_t current_stream() {
  // Created once, never destroyed (destroying it at exit could run after the driver shut down).
  static cudaStream_t stream = [] {
    cudaStream_t s = nullptr;
    LOOM_CUDA_CHECK(cudaStreamCreate(&s));
    return s;
  }();
  return stream;
}

void synchronize() { LOOM_CUDA_CHECK(cudaStreamSynchronize(current_stream())); }

void check_on_device(const char* fn, const char* arg, const Tensor& t) {
  LOOM_CHECK(t.device() == Device::kCuda,
             "%s: argument %s is %s, but the kernel runs on CUDA: every tensor argument must be "
             "on the same device",
             fn, arg, t.describe().c_str());
}

void check_same_device(const char* fn, const char* names,
                       std::initializer_list<const Tensor*> args) {
  const Tensor* first = nullptr;
  for (const Tensor* t : args) {
    if (!t->defined()) continue;
    if (first == nullptr) first = t;
    if (t->device() != first->device()) {
      std::string all;
      for (const Tensor* u : args) all += (all.empty() ? "" : ", ") + u->describe();
      LOOM_CHECK(false,
                 "%s: arguments (%s) are on different devices: %s; every tensor argument "
                 "must be on the same device",
                 fn, names, all.c_str());
    }
  }
}

Tensor to_device(const Tensor& host) {
  init();
  LOOM_CHECK(host.device() == Device::kCpu && host.is_contiguous(),
             "to_device: expected a contiguous host tensor, got %s", host.describe().c_str());
  Tensor d = Tensor::empty(host.shape(), host.dtype(), Device::kCuda);
  if (host.nbytes() > 0) {
    LOOM_CUDA_CHECK(cudaMemcpyAsync(d.raw(), host.raw(), host.nbytes(), cudaMemcpyHostToDevice,
                                    current_stream()));
  }
  return d;
}

Tensor to_host(const Tensor& dev) {
  LOOM_CHECK(dev.device() == Device::kCuda && dev.is_contiguous(),
             "to_host: expected a contiguous CUDA tensor, got %s", dev.describe().c_str());
  Tensor h = Tensor::empty(dev.shape(), dev.dtype(), Device::kCpu);
  if (dev.nbytes() > 0) {
    LOOM_CUDA_CHECK(cudaMemcpyAsync(h.raw(), dev.raw(), dev.nbytes(), cudaMemcpyDeviceToHost,
                                    current_stream()));
  }
  synchronize();
  return h;
}

Scratch::Scratch(size_t bytes) {
  LOOM_CUDA_CHECK(cudaMallocAsync(&ptr_, bytes == 0 ? 16 : bytes, current_stream()));
}

Scratch::~Scratch() {
  if (ptr_ != nullptr) LOOM_CUDA_CHECK(cudaFreeAsync(ptr_, current_stream()));
}

void Scratch::upload(const void* host, size_t bytes) {
  if (bytes == 0) return;
  LOOM_CUDA_CHECK(cudaMemcpyAsync(ptr_, host, bytes, cudaMemcpyHostToDevice, current_stream()));
}

}  // namespace loom::cuda
