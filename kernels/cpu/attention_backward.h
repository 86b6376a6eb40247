// CPU implementation of kernels/attention_backward.h (contracts checked there).
#pragma once

#include "core/tensor.h"

namespace loom::cpu {

void causal_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                              const Tensor& out, const Tensor& lse);
void causal_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                               const Tensor& lse, const Tensor& d_out, float scale,
                               const Tensor& dq, const Tensor& dk, const Tensor& dv);

}  // namespace loom::cpu
