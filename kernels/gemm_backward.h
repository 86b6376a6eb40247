// Backward of linear_forward (kernels/gemm.h), for the trainer.
#pragma once

#include "core/tensor.h"
#include "kernels/exec.h"

namespace loom {

// Gradients of out = x @ w^T given d_out:
//   d_x = beta * d_x + d_out @ w        (beta = 0 overwrites, 1 adds: a layer input read by several
//                                        projections sums their gradients)
//   d_w += d_out^T @ x                  (a parameter gradient: accumulated)
// x: [M, K]; w: [N, K] f32; d_out: [M, N]; d_x: [M, K] (undefined: not wanted); d_w: [N, K].
void linear_backward(const Exec& ex, const Tensor& x, const Tensor& w, const Tensor& d_out,
                     const Tensor& d_x, float beta, const Tensor& d_w);

}  // namespace loom
