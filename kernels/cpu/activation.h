// CPU implementations of kernels/activation.h (same contracts).
#pragma once

#include "core/tensor.h"

namespace loom::cpu {

void silu_mul_forward(const Tensor& gate, const Tensor& up, const Tensor& out);
void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out);
// Contracts checked by kernels/activation.cc (embedding_backward is cpu::scatter_add_rows).
void silu_mul_backward(const Tensor& gate, const Tensor& up, const Tensor& dout,
                       const Tensor& dgate, const Tensor& dup);

// out[i] = silu(gate[i]) * up[i] over n elements (out may alias gate or up).
void silu_mul(const float* gate, const float* up, float* out, int64_t n);

}  // namespace loom::cpu
