// CUDA twins of kernels/cache_ops.h (contracts checked by the dispatcher): async memsets and
// device-to-device copies on the Exec's stream, without synchronising.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "kernels/cuda/check.h"
#include "kernels/exec.h"

namespace loom::cuda {

void cache_zero_slots(const Exec& ex, const Tensor& pool, int64_t begin, int64_t end);
void cache_copy_slot(const Exec& ex, const Tensor& src_pool, int64_t src, const Tensor& dst_pool,
                     int64_t dst);
void cache_copy_page_rows(const Exec& ex, const Tensor& src_pool, int64_t src_page,
                          const Tensor& dst_pool, int64_t dst_page, int64_t r0, int64_t r1);

}  // namespace loom::cuda
