// CPU implementations of kernels/norm.h (same contracts).
#pragma once

#include "core/tensor.h"

namespace loom::cpu {

void rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, float weight_offset,
                     const Tensor& out);
void l2norm_forward(const Tensor& x, float eps, float scale, const Tensor& out);

}  // namespace loom::cpu
