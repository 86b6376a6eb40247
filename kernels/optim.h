// Optimizer kernels for the trainer: the AdamW update of one parameter tensor and the sum of
// squares that global-norm clipping needs. f32 master weights and moments (the GPU computes in
// bf16 but keeps these in f32).
#pragma once

#include <cmath>
#include <cstdint>
#include <span>

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

// One tensor of adamw_update_many: adamw_update's four, and whether the weight decay applies (not
// to norms, biases and gates).
struct AdamWTensor {
  Tensor param, grad, m, v;
  bool decay = true;
};

// The gradient scale of a step from the gradients' sum of squares: `mean`, times clip_norm / norm
// when the scaled global norm, norm = sqrt(sum_squares) * mean, exceeds clip_norm > 0. In double;
// the GPU's update computes the same from the sum where it lies, so that no read back of the norm
// stands between a step's backward and its update.
#if defined(__CUDACC__)
#define LOOM_OPTIM_HD __host__ __device__ inline
#else
#define LOOM_OPTIM_HD inline
#endif
LOOM_OPTIM_HD double clipped_grad_scale(double sum_squares, double mean, double clip_norm) {
  const double norm = sqrt(sum_squares) * mean;  // IEEE-rounded on the host and the device
  return clip_norm > 0 && norm > clip_norm ? mean * (clip_norm / norm) : mean;
}
struct GradScale {
  Tensor sum_squares;  // f32 [1] on the Exec's device (sum_of_squares's out)
  double mean = 1.0;
  double clip_norm = 0.0;  // 0: no clipping
};

// adamw_update of every tensor of `tensors` with s's hyperparameters (s.weight_decay where decay
// is set, 0 elsewhere) and the gradient scaled by float(clipped_grad_scale(...)) of `scale` in
// place of s.grad_scale: the same bits as those adamw_update calls, in one launch per 64 tensors
// on the GPU (a launch per tensor cost more than the updates of a small model's ~100 tensors).
void adamw_update_many(const Exec& ex, const AdamWStep& s, std::span<const AdamWTensor> tensors,
                       const GradScale& scale);

// sum(x^2) of an f32 tensor, accumulated in double in a fixed order (the same bits for the same
// input whatever the thread count) and rounded once into out (f32 [1] on ex.device).
void sum_of_squares(const Exec& ex, const Tensor& x, const Tensor& out);

}  // namespace loom
