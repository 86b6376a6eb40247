// CPU implementations of kernels/cache_ops.h (contracts checked by the dispatcher).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace loom::cpu {

void cache_zero_slots(const Tensor& pool, int64_t begin, int64_t end);
void cache_copy_slot(const Tensor& src_pool, int64_t src, const Tensor& dst_pool, int64_t dst);
void cache_copy_page_rows(const Tensor& src_pool, int64_t src_page, const Tensor& dst_pool,
                          int64_t dst_page, int64_t r0, int64_t r1);

}  // namespace loom::cpu
