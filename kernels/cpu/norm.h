// CPU implementations of kernels/norm.h (same contracts).
#pragma once

#include "core/tensor.h"

namespace loom::cpu {

void rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, float weight_offset,
                     const Tensor& out);
void l2norm_forward(const Tensor& x, float eps, float scale, const Tensor& out);

// Backward passes; contracts checked by kernels/norm.cc. rstd: f32 [N] scratch.
void rmsnorm_backward(const Tensor& x, const Tensor& w, float eps, float weight_offset,
                      const Tensor& dout, const Tensor& dx, const Tensor& dw, const Tensor& rstd);
void l2norm_backward(const Tensor& x, float eps, float scale, const Tensor& dout, const Tensor& dx);

}  // namespace loom::cpu
