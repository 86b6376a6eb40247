// CUDA twins of the same-named kernels/ header: same contracts, every tensor argument on the GPU
// (f32 contiguous), enqueued on the Exec's stream without synchronising.
#pragma once

#include "core/tensor.h"
#include "kernels/cuda/check.h"
#include "kernels/exec.h"

namespace loom::cuda {

// dk <= 256 (state columns held in registers); any dv; Hv a multiple of Hk; g [T, Hv, dk] or
// [T, Hv, 1].
void kda_recurrent_forward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                           const Tensor& g, const Tensor& beta, float scale, const Tensor& state,
                           const Tensor& out);
// dt_bias may be undefined (no bias).
void kda_gate_forward(const Exec& ex, const Tensor& f, const Tensor& A_log, const Tensor& dt_bias,
                      float lower_bound, const Tensor& g);

}  // namespace loom::cuda
