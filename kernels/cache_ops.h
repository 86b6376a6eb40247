// Cache pool maintenance: state-slot resets and copies, and page row copies (prefix-cache
// checkpoints, a private cache growing into a longer page). A pool is a contiguous tensor whose
// first dimension indexes slots or pages, of any dtype; ids are scalars, so these ops need no
// upload and run as plain memset/memcpy on the host and as stream-ordered async memsets and
// copies on a GPU (nothing synchronises).
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "kernels/exec.h"

namespace loom {

// Zeroes pool[begin:end] (a sequence starting fresh; a new pool). pool: [N, ...] contiguous;
// 0 <= begin <= end <= N.
void cache_zero_slots(const Exec& ex, const Tensor& pool, int64_t begin, int64_t end);

// dst_pool[dst] = src_pool[src]. Both contiguous, same dtype, equal shapes past the first
// dimension; the pools may be one tensor (then src == dst copies nothing) but may not overlap
// otherwise.
void cache_copy_slot(const Exec& ex, const Tensor& src_pool, int64_t src, const Tensor& dst_pool,
                     int64_t dst);

// Rows [r0, r1) of page src_page of src_pool into the same rows of page dst_page of dst_pool.
// Pools: [num_pages, page_size, row...] contiguous, same dtype and row shape; the page sizes may
// differ but both hold r1 rows. An empty range (r0 == r1) copies nothing and names no page.
void cache_copy_page_rows(const Exec& ex, const Tensor& src_pool, int64_t src_page,
                          const Tensor& dst_pool, int64_t dst_page, int64_t r0, int64_t r1);

}  // namespace loom
