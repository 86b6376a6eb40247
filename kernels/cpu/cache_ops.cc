#include "kernels/cpu/cache_ops.h"

#include <cstring>

namespace loom::cpu {
namespace {

// Item i (a slot or a page) of a contiguous pool, and its size.
char* item(const Tensor& pool, int64_t i) {
  return static_cast<char*>(pool.raw()) + i * pool.stride(0) * dtype_size(pool.dtype());
}
size_t item_bytes(const Tensor& pool) { return pool.stride(0) * dtype_size(pool.dtype()); }

}  // namespace

void cache_zero_slots(const Tensor& pool, int64_t begin, int64_t end) {
  if (end > begin) std::memset(item(pool, begin), 0, (end - begin) * item_bytes(pool));
}

void cache_copy_slot(const Tensor& src_pool, int64_t src, const Tensor& dst_pool, int64_t dst) {
  std::memcpy(item(dst_pool, dst), item(src_pool, src), item_bytes(src_pool));
}

void cache_copy_page_rows(const Tensor& src_pool, int64_t src_page, const Tensor& dst_pool,
                          int64_t dst_page, int64_t r0, int64_t r1) {
  const size_t row = src_pool.stride(1) * dtype_size(src_pool.dtype());
  std::memcpy(item(dst_pool, dst_page) + r0 * row, item(src_pool, src_page) + r0 * row,
              (r1 - r0) * row);
}

}  // namespace loom::cpu
