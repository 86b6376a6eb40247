// Optimizer kernels for the trainer: the AdamW update of one parameter tensor and the sum of
// squares that global-norm clipping needs. f32 master weights and moments (the GPU computes in
// bf16 but keeps these in f32).
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "kernels/exec.h"

namespace loom {

struct AdamWStep {
  float lr = 0.0f;
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled (applied to the weight, not through the moments)
  int64_t step = 1;           // 1 for the first update (bias corrections use it)
  float grad_scale = 1.0f;    // the gradient is used as grad * grad_scale (clipping, averaging)
};

// torch.optim.AdamW's update, element by element, in this order:
//   g = grad * grad_scale;  param *= 1 - lr * weight_decay;
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2;
//   param -= (lr / (1 - beta1^step)) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
// param, grad, m, v: f32 contiguous of one shape; param, m and v are updated in place.
void adamw_update(const Exec& ex, const AdamWStep& s, const Tensor& param, const Tensor& grad,
                  const Tensor& m, const Tensor& v);

// sum(x^2) of an f32 tensor, accumulated in double in a fixed order (the same bits for the same
// input whatever the thread count) and rounded once into out (f32 [1] on ex.device).
void sum_of_squares(const Exec& ex, const Tensor& x, const Tensor& out);

}  // namespace loom
