#include "kernels/cuda/cache_ops.h"

#include "kernels/cuda/device.h"

namespace loom::cuda {
namespace {

char* item(const Tensor& pool, int64_t i) {
  return static_cast<char*>(pool.raw()) + i * pool.stride(0) * dtype_size(pool.dtype());
}

}  // namespace

void cache_zero_slots(const Exec& ex, const Tensor& pool, int64_t begin, int64_t end) {
  LOOM_CHECK_CUDA_ARG("cache_zero_slots", pool);
  const DeviceGuard on(ex.device.index);
  const size_t bytes = (end - begin) * pool.stride(0) * dtype_size(pool.dtype());
  LOOM_CUDA_CHECK(cudaMemsetAsync(item(pool, begin), 0, bytes, stream_of(ex)));
}

void cache_copy_slot(const Exec& ex, const Tensor& src_pool, int64_t src, const Tensor& dst_pool,
                     int64_t dst) {
  LOOM_CHECK_CUDA_ARG("cache_copy_slot", src_pool);
  LOOM_CHECK_CUDA_ARG("cache_copy_slot", dst_pool);
  const DeviceGuard on(ex.device.index);
  const size_t bytes = src_pool.stride(0) * dtype_size(src_pool.dtype());
  LOOM_CUDA_CHECK(cudaMemcpyAsync(item(dst_pool, dst), item(src_pool, src), bytes,
                                  cudaMemcpyDeviceToDevice, stream_of(ex)));
}

void cache_copy_page_rows(const Exec& ex, const Tensor& src_pool, int64_t src_page,
                          const Tensor& dst_pool, int64_t dst_page, int64_t r0, int64_t r1) {
  LOOM_CHECK_CUDA_ARG("cache_copy_page_rows", src_pool);
  LOOM_CHECK_CUDA_ARG("cache_copy_page_rows", dst_pool);
  const DeviceGuard on(ex.device.index);
  const size_t row = src_pool.stride(1) * dtype_size(src_pool.dtype());
  LOOM_CUDA_CHECK(cudaMemcpyAsync(item(dst_pool, dst_page) + r0 * row,
                                  item(src_pool, src_page) + r0 * row, (r1 - r0) * row,
                                  cudaMemcpyDeviceToDevice, stream_of(ex)));
}

}  // namespace loom::cuda
