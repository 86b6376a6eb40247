// CPU implementation of kernels/optim.h (contracts checked there).
#pragma once

#include "core/tensor.h"
#include "kernels/optim.h"

namespace loom::cpu {

void adamw_update(const AdamWStep& s, const Tensor& param, const Tensor& grad, const Tensor& m,
                  const Tensor& v);
void sum_of_squares(const Tensor& x, const Tensor& out);

}  // namespace loom::cpu
