// CPU implementations of kernels/conv.h (same contracts).
#pragma once

#include "core/tensor.h"

namespace loom::cpu {

void causal_conv1d_forward(const Tensor& x, const Tensor& weight, const Tensor& conv_state,
                           bool apply_silu, const Tensor& out);
void causal_conv1d_varlen(const Tensor& x, const Tensor& weight, const Tensor& conv_states,
                          const Tensor& state_slots, const Tensor& cu_seqlens, bool apply_silu,
                          const Tensor& out);
void causal_conv1d_step(const Tensor& x, const Tensor& weight, const Tensor& conv_states,
                        bool apply_silu, const Tensor& out);
// Contracts checked by kernels/conv.cc.
void causal_conv1d_backward(const Tensor& x, const Tensor& weight, const Tensor& initial_state,
                            bool apply_silu, const Tensor& dout, const Tensor& dfinal_state,
                            const Tensor& dx, const Tensor& dweight, const Tensor& dinitial_state);

}  // namespace loom::cpu
