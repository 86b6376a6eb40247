// CUDA twins of the same-named kernels/ header: same contracts, every tensor argument on the GPU
// (f32 contiguous), enqueued on the Exec's stream without synchronising.
#pragma once

#include "core/tensor.h"
#include "kernels/cuda/check.h"
#include "kernels/exec.h"

namespace loom::cuda {

void causal_conv1d_forward(const Exec& ex, const Tensor& x, const Tensor& weight,
                           const Tensor& conv_state, bool apply_silu, const Tensor& out);
void causal_conv1d_step(const Exec& ex, const Tensor& x, const Tensor& weight,
                        const Tensor& conv_states, bool apply_silu, const Tensor& out);

}  // namespace loom::cuda
