// CPU implementation of kernels/loss.h (contracts checked there).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace loom::cpu {

// The scratch of one call: f32 for the logits chunk, the gathered rows and their gradients and the
// per-row log-sum-exp state; i64 for the indices of the rows of a chunk.
struct CrossEntropyScratch {
  Shape f32;
  Shape rows;
};
CrossEntropyScratch cross_entropy_scratch(int64_t t, int64_t v, int64_t d);

void cross_entropy_forward_backward(const Tensor& hidden, const Tensor& lm_head,
                                    const Tensor& targets, int64_t ignore_index, float loss_scale,
                                    const Tensor& loss, const Tensor& row_loss,
                                    const Tensor& dhidden, const Tensor& dlm_head,
                                    const Tensor& scratch, const Tensor& rows,
                                    const Tensor& row_weight);

}  // namespace loom::cpu
