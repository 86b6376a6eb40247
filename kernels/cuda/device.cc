#include "kernels/cuda/device.h"

#include <array>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>

#include "core/allocator.h"
#include "core/pinned_block_cache.h"

namespace loom::cuda {
namespace {

void* device_alloc(size_t bytes, int index) {
  const DeviceGuard on(index);
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    std::fprintf(stderr, "cudaMalloc of %zu bytes on device %d failed: %s\n", bytes, index,
                 cudaGetErrorString(e));
    (void)cudaGetLastError();  // clear the sticky-free error so the caller's check reports it
    return nullptr;            // allocate_buffer aborts with the size
  }
  return p;
}

void device_free(void* p, int index) {
  const DeviceGuard on(index);
  LOOM_CUDA_CHECK(cudaFree(p));
}

// Page-locked host memory for asynchronous copies with any device (core/allocator.h).
void* pinned_alloc_system(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  if (e != cudaSuccess) {
    std::fprintf(stderr, "cudaHostAlloc of %zu bytes failed: %s\n", bytes, cudaGetErrorString(e));
    (void)cudaGetLastError();
    return nullptr;  // allocate_transfer_buffer aborts with the size
  }
  return p;
}

void pinned_free_system(void* p) { LOOM_CUDA_CHECK(cudaFreeHost(p)); }

// Released page-locked blocks are kept for reuse (core/pinned_block_cache.h says why), up to
// LOOM_PINNED_CACHE_MB (default 4096 MiB, the session offload tier's default budget) in total.
PinnedBlockCache& pinned_cache() {
  static PinnedBlockCache* cache = [] {
    const char* env = std::getenv("LOOM_PINNED_CACHE_MB");
    const long long mib = env != nullptr ? std::strtoll(env, nullptr, 10) : 4096;
    return new PinnedBlockCache(pinned_alloc_system, pinned_free_system,
                                static_cast<size_t>(mib > 0 ? mib : 0) << 20);
  }();  // never destroyed: buffers may be released during static teardown
  return *cache;
}
void* pinned_alloc(size_t bytes) { return pinned_cache().allocate(bytes); }
void pinned_free(void* p) { pinned_cache().release(p); }

// core/allocator.h's copier: ordered after everything already enqueued on the device's stream,
// and finished on return (host memory on either side may be reused at once).
void device_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  const int index = dst_device.is_cuda() ? dst_device.index : src_device.index;
  const DeviceContext& c = device_context(index);
  const DeviceGuard on(index);
  LOOM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, c.stream));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(c.stream));
}

#define LOOM_CUBLAS_INIT_CHECK(call)                                                              \
  do {                                                                                            \
    const cublasStatus_t loom_cublas_st_ = (call);                                                \
    LOOM_CHECK(loom_cublas_st_ == CUBLAS_STATUS_SUCCESS, "cuBLAS call %s failed: %s (%d)", #call, \
               cublasGetStatusString(loom_cublas_st_), static_cast<int>(loom_cublas_st_));        \
  } while (0)

constexpr size_t kBlasWorkspaceBytes = size_t{32} << 20;

// Enough for the largest NVLink domains; a larger index is refused with a message.
constexpr int kMaxDevices = 64;

}  // namespace

void init() {
  static std::once_flag once;
  std::call_once(once, [] {
    int count = 0;
    LOOM_CUDA_CHECK(cudaGetDeviceCount(&count));
    LOOM_CHECK(count > 0, "loom::cuda::init: no CUDA device");
    set_device_allocator(&device_alloc, &device_free);
    set_device_copier(&device_copy);
    set_pinned_host_allocator(&pinned_alloc, &pinned_free);
  });
}

int visible_devices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

void memory_info(int index, size_t* free_bytes, size_t* total_bytes) {
  const DeviceGuard on(index);
  LOOM_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
}

DeviceGuard::DeviceGuard(int index) {
  LOOM_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != index) LOOM_CUDA_CHECK(cudaSetDevice(index));
}

DeviceGuard::~DeviceGuard() {
  int now = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&now));
  if (now != previous_) LOOM_CUDA_CHECK(cudaSetDevice(previous_));
}

const DeviceContext& device_context(int index) {
  init();
  int count = 0;
  LOOM_CUDA_CHECK(cudaGetDeviceCount(&count));
  LOOM_CHECK(index >= 0 && index < count && index < kMaxDevices,
             "CUDA device %d does not exist (%d visible)", index, count);
  static std::array<std::once_flag, kMaxDevices> once;
  static std::array<DeviceContext, kMaxDevices> contexts;
  std::call_once(once[index], [index] {
    const DeviceGuard on(index);
    DeviceContext& c = contexts[index];
    c.index = index;
    LOOM_CUDA_CHECK(cudaStreamCreate(&c.stream));
    LOOM_CUBLAS_INIT_CHECK(cublasCreate(&c.blas));
    // DEFAULT_MATH keeps cublasSgemm in true f32 (TF32 tensor cores only with TF32_TENSOR_OP).
    LOOM_CUBLAS_INIT_CHECK(cublasSetMathMode(c.blas, CUBLAS_DEFAULT_MATH));
    LOOM_CUBLAS_INIT_CHECK(cublasSetPointerMode(c.blas, CUBLAS_POINTER_MODE_HOST));
    LOOM_CUBLAS_INIT_CHECK(cublasSetStream(c.blas, c.stream));
    // A workspace of our own, set after the stream (cublasSetStream drops a user workspace):
    // without one cuBLAS may allocate during a call, which a CUDA graph's capture cannot record.
    // 32 MiB is what cuBLAS asks for on Hopper; the handle is only ever used on c.stream.
    void* workspace = nullptr;
    LOOM_CUDA_CHECK(cudaMalloc(&workspace, kBlasWorkspaceBytes));
    LOOM_CUBLAS_INIT_CHECK(cublasSetWorkspace(c.blas, workspace, kBlasWorkspaceBytes));
  });
  return contexts[index];
}

Exec device_exec(int index, Workspace* workspace) {
  Exec ex;
  ex.device = Device::cuda(index);
  ex.stream = device_context(index).stream;
  ex.workspace = workspace;
  return ex;
}

cudaStream_t stream_of(const Exec& ex) {
  LOOM_CHECK(ex.device.is_cuda() && ex.stream != nullptr,
             "a CUDA op was given an execution context on %s without a stream",
             device_name(ex.device).c_str());
  return static_cast<cudaStream_t>(ex.stream);
}

void synchronize(Device device) {
  LOOM_CUDA_CHECK(cudaStreamSynchronize(device_context(device.index).stream));
}

void check_on_device(const char* fn, const char* arg, const Tensor& t) {
  LOOM_CHECK(t.device().is_cuda(),
             "%s: argument %s is %s, but the kernel runs on CUDA: every tensor argument must be "
             "on the same device",
             fn, arg, t.describe().c_str());
}

Tensor to_device(const Tensor& host, Device device) {
  LOOM_CHECK(host.device().is_cpu() && host.is_contiguous() && device.is_cuda(),
             "to_device: expected a contiguous host tensor and a CUDA device, got %s to %s",
             host.describe().c_str(), device_name(device).c_str());
  const cudaStream_t stream = device_context(device.index).stream;
  Tensor d = Tensor::empty(host.shape(), host.dtype(), device);
  if (host.nbytes() > 0) {
    LOOM_CUDA_CHECK(
        cudaMemcpyAsync(d.raw(), host.raw(), host.nbytes(), cudaMemcpyHostToDevice, stream));
  }
  return d;
}

Tensor to_host(const Tensor& dev) {
  LOOM_CHECK(dev.device().is_cuda() && dev.is_contiguous(),
             "to_host: expected a contiguous CUDA tensor, got %s", dev.describe().c_str());
  const cudaStream_t stream = device_context(dev.device().index).stream;
  Tensor h = Tensor::empty(dev.shape(), dev.dtype(), Device::kCpu);
  if (dev.nbytes() > 0) {
    LOOM_CUDA_CHECK(
        cudaMemcpyAsync(h.raw(), dev.raw(), dev.nbytes(), cudaMemcpyDeviceToHost, stream));
  }
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
  return h;
}

Scratch::Scratch(size_t bytes, cudaStream_t stream) : stream_(stream) {
  LOOM_CUDA_CHECK(cudaMallocAsync(&ptr_, bytes == 0 ? 16 : bytes, stream_));
}

Scratch::~Scratch() {
  if (ptr_ != nullptr) LOOM_CUDA_CHECK(cudaFreeAsync(ptr_, stream_));
}

void Scratch::upload(const void* host, size_t bytes) {
  if (bytes == 0) return;
  LOOM_CUDA_CHECK(cudaMemcpyAsync(ptr_, host, bytes, cudaMemcpyHostToDevice, stream_));
}

}  // namespace loom::cuda
