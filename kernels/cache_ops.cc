// Contracts of kernels/cache_ops.h, checked once, then the cpu:: or cuda:: twin.
#include "kernels/cache_ops.h"

#include "kernels/cpu/cache_ops.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/cache_ops.h"
#endif

namespace loom {
namespace {

void check_pool(const char* op, const Tensor& pool, int min_dims) {
  LOOM_CHECK(pool.defined() && pool.ndim() >= min_dims && pool.is_contiguous(),
             "%s: pool %s must be a contiguous tensor of at least %d dimensions", op,
             pool.describe().c_str(), min_dims);
}

// Same dtype and the same shape past the first `skip` dimensions.
void check_same_items(const char* op, const Tensor& a, const Tensor& b, int skip) {
  bool same = a.dtype() == b.dtype() && a.ndim() == b.ndim();
  for (int i = skip; same && i < a.ndim(); ++i) same = a.dim(i) == b.dim(i);
  LOOM_CHECK(same, "%s: pools %s and %s hold different items", op, a.describe().c_str(),
             b.describe().c_str());
}

void check_id(const char* op, const char* what, int64_t id, const Tensor& pool) {
  LOOM_CHECK(id >= 0 && id < pool.dim(0), "%s: %s %lld outside [0, %lld) of %s", op, what,
             static_cast<long long>(id), static_cast<long long>(pool.dim(0)),
             pool.describe().c_str());
}

// Byte ranges [a, a + n) and [b, b + n) that overlap without coinciding would make the copy's
// result depend on its order; coinciding ones make it a no-op.
bool same_bytes_or_disjoint(const char* op, const void* a, const void* b, size_t n) {
  const char* x = static_cast<const char*>(a);
  const char* y = static_cast<const char*>(b);
  if (x == y) return true;
  LOOM_CHECK(x + n <= y || y + n <= x, "%s: source and destination overlap", op);
  return false;
}

const char* item_at(const Tensor& pool, int64_t i, int64_t row = 0) {
  return static_cast<const char*>(pool.raw()) +
         (i * pool.stride(0) + row * (pool.ndim() > 1 ? pool.stride(1) : 0)) *
             dtype_size(pool.dtype());
}

}  // namespace

void cache_zero_slots(const Exec& ex, const Tensor& pool, int64_t begin, int64_t end) {
  LOOM_ON_EXEC_DEVICE(ex, "cache_zero_slots", pool);
  check_pool("cache_zero_slots", pool, 1);
  LOOM_CHECK(0 <= begin && begin <= end && end <= pool.dim(0),
             "cache_zero_slots: [%lld, %lld) outside [0, %lld) of %s",
             static_cast<long long>(begin), static_cast<long long>(end),
             static_cast<long long>(pool.dim(0)), pool.describe().c_str());
  if (begin == end) return;
  if (ex.device.is_cpu()) return cpu::cache_zero_slots(pool, begin, end);
#ifdef LOOM_WITH_CUDA
  return cuda::cache_zero_slots(ex, pool, begin, end);
#else
  no_kernel_for(ex, "cache_zero_slots");
#endif
}

void cache_copy_slot(const Exec& ex, const Tensor& src_pool, int64_t src, const Tensor& dst_pool,
                     int64_t dst) {
  const char* op = "cache_copy_slot";
  LOOM_ON_EXEC_DEVICE(ex, "cache_copy_slot", src_pool, dst_pool);
  check_pool(op, src_pool, 1);
  check_pool(op, dst_pool, 1);
  check_same_items(op, src_pool, dst_pool, 1);
  check_id(op, "source slot", src, src_pool);
  check_id(op, "destination slot", dst, dst_pool);
  const size_t bytes = src_pool.stride(0) * dtype_size(src_pool.dtype());
  if (bytes == 0 ||
      same_bytes_or_disjoint(op, item_at(src_pool, src), item_at(dst_pool, dst), bytes))
    return;
  if (ex.device.is_cpu()) return cpu::cache_copy_slot(src_pool, src, dst_pool, dst);
#ifdef LOOM_WITH_CUDA
  return cuda::cache_copy_slot(ex, src_pool, src, dst_pool, dst);
#else
  no_kernel_for(ex, op);
#endif
}

void cache_copy_page_rows(const Exec& ex, const Tensor& src_pool, int64_t src_page,
                          const Tensor& dst_pool, int64_t dst_page, int64_t r0, int64_t r1) {
  const char* op = "cache_copy_page_rows";
  LOOM_ON_EXEC_DEVICE(ex, "cache_copy_page_rows", src_pool, dst_pool);
  check_pool(op, src_pool, 2);
  check_pool(op, dst_pool, 2);
  check_same_items(op, src_pool, dst_pool, 2);
  LOOM_CHECK(0 <= r0 && r0 <= r1, "%s: rows [%lld, %lld)", op, static_cast<long long>(r0),
             static_cast<long long>(r1));
  if (r0 == r1) return;
  check_id(op, "source page", src_page, src_pool);
  check_id(op, "destination page", dst_page, dst_pool);
  LOOM_CHECK(r1 <= src_pool.dim(1) && r1 <= dst_pool.dim(1),
             "%s: rows [%lld, %lld) do not fit pages of %lld and %lld rows", op,
             static_cast<long long>(r0), static_cast<long long>(r1),
             static_cast<long long>(src_pool.dim(1)), static_cast<long long>(dst_pool.dim(1)));
  const size_t bytes = (r1 - r0) * src_pool.stride(1) * dtype_size(src_pool.dtype());
  if (bytes == 0 || same_bytes_or_disjoint(op, item_at(src_pool, src_page, r0),
                                           item_at(dst_pool, dst_page, r0), bytes))
    return;
  if (ex.device.is_cpu())
    return cpu::cache_copy_page_rows(src_pool, src_page, dst_pool, dst_page, r0, r1);
#ifdef LOOM_WITH_CUDA
  return cuda::cache_copy_page_rows(ex, src_pool, src_page, dst_pool, dst_page, r0, r1);
#else
  no_kernel_for(ex, op);
#endif
}

}  // namespace loom
