// CUDA twins of the same-named kernels/ header: same contracts, every tensor argument on the GPU
// (contiguous; x f32 or bf16), enqueued on the Exec's stream without synchronising.
#pragma once

#include <cstdint>

#include "kernels/rope.h"

namespace loom::cuda {

// positions and table.inv_freq are device tensors (step data; the table copied once).
void rope_forward(const Exec& ex, const Tensor& x, const Tensor& positions, const RopeTable& table,
                  int64_t dim_offset);
// dx (f32) holds dy on entry: the transposed rotation in place (kernels/rope.h).
void rope_backward(const Exec& ex, const Tensor& dx, const Tensor& positions,
                   const RopeTable& table, int64_t dim_offset);

}  // namespace loom::cuda
