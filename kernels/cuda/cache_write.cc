// Host side of the varlen CUDA cache write: the checks of kernels/cpu/attention.cc that need no
// values from the device (shapes, dtypes, devices), then one launch.
#include "kernels/cuda/cache_write.h"

#include <cstdint>

#include "kernels/attention.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/varlen_launch.h"

namespace loom::cuda {

void cache_write_varlen(const Exec& ex, const Tensor& pool, const Tensor& page_table,
                        const Tensor& cu_seqlens, const Tensor& past_lens, const Tensor& rows) {
  const char* fn = "cache_write_varlen";
  LOOM_CHECK_CUDA_ARG(fn, pool);
  LOOM_CHECK_CUDA_ARG(fn, page_table);
  LOOM_CHECK_CUDA_ARG(fn, cu_seqlens);
  LOOM_CHECK_CUDA_ARG(fn, past_lens);
  LOOM_CHECK_CUDA_ARG(fn, rows);
  const auto f32_or_bf16 = [](const Tensor& t) {
    return t.dtype() == DType::kF32 || t.dtype() == DType::kBF16;
  };
  const bool fp8 = pool.dtype() == DType::kF8E4M3;
  LOOM_CHECK((f32_or_bf16(pool) || fp8) && f32_or_bf16(rows),
             "%s: pool %s rows %s, expected an f32, bf16 or fp8 pool and f32 or bf16 rows", fn,
             pool.describe().c_str(), rows.describe().c_str());
  LOOM_CHECK(pool.ndim() >= 2 && pool.is_contiguous() && rows.ndim() >= 1 && rows.is_contiguous(),
             "%s: pool %s rows %s, expected a contiguous [num_pages, page_size, row...] pool and "
             "contiguous [N, row...] rows",
             fn, pool.describe().c_str(), rows.describe().c_str());
  const int64_t num_pages = pool.dim(0), page_size = pool.dim(1);
  const int64_t N = rows.dim(0);
  const int64_t row_elems = num_pages * page_size > 0 ? pool.numel() / (num_pages * page_size) : 0;
  // An fp8 pool's row is `vectors` vectors of n codes and a scale each (kernels/attention.h).
  const int64_t n = kv_pool_vector_dim(pool);
  const int64_t last = pool.dim(pool.ndim() - 1);
  const int64_t vectors = fp8 && last > 0 ? row_elems / last : 0;
  LOOM_CHECK(!fp8 || (pool.ndim() >= 3 && n > 0),
             "%s: fp8 pool %s, expected [num_pages, page_size, ..., n + %lld] bytes", fn,
             pool.describe().c_str(), static_cast<long long>(kKvFp8ScaleBytes));
  const int64_t row_values = fp8 ? vectors * n : row_elems;
  LOOM_CHECK(N == 0 || (page_size > 0 && rows.numel() == N * row_values),
             "%s: rows %s into rows of %lld values", fn, rows.describe().c_str(),
             static_cast<long long>(row_values));
  LOOM_CHECK(cu_seqlens.dtype() == DType::kI64 && cu_seqlens.ndim() == 1 &&
                 cu_seqlens.dim(0) >= 1 && cu_seqlens.is_contiguous(),
             "%s: cu_seqlens %s, expected contiguous i64 [B + 1]", fn,
             cu_seqlens.describe().c_str());
  const int64_t B = cu_seqlens.dim(0) - 1;
  LOOM_CHECK(page_table.dtype() == DType::kI32 && page_table.ndim() == 2 &&
                 page_table.dim(0) == B && page_table.is_contiguous(),
             "%s: page_table %s for %lld sequences", fn, page_table.describe().c_str(),
             static_cast<long long>(B));
  LOOM_CHECK(past_lens.dtype() == DType::kI64 && past_lens.ndim() == 1 && past_lens.dim(0) == B &&
                 past_lens.is_contiguous(),
             "%s: past_lens %s for %lld sequences", fn, past_lens.describe().c_str(),
             static_cast<long long>(B));
  if (fp8) {
    return launch::cache_write_varlen_fp8(stream_of(ex), rows.raw(), rows.dtype() == DType::kBF16,
                                          pool.raw(), page_table.data<int32_t>(),
                                          cu_seqlens.data<int64_t>(), past_lens.data<int64_t>(), N,
                                          B, page_table.dim(1), num_pages, page_size, vectors, n);
  }
  launch::cache_write_varlen(stream_of(ex), rows.raw(), rows.dtype() == DType::kBF16, pool.raw(),
                             pool.dtype() == DType::kBF16, page_table.data<int32_t>(),
                             cu_seqlens.data<int64_t>(), past_lens.data<int64_t>(), N, B,
                             page_table.dim(1), num_pages, page_size, row_elems);
}

}  // namespace loom::cuda
