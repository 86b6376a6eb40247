// CPU implementation of kernels/kda_backward.h (contracts checked there).
#pragma once

#include "core/tensor.h"

namespace loom::cpu {

void kda_recurrent_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                            const Tensor& beta, float scale, const Tensor& initial_state,
                            const Tensor& d_out, const Tensor& d_final_state, const Tensor& dq,
                            const Tensor& dk, const Tensor& dv, const Tensor& dg,
                            const Tensor& dbeta, const Tensor& d_initial_state);

void kda_gate_backward(const Tensor& f, const Tensor& A_log, const Tensor& dt_bias,
                       float lower_bound, const Tensor& d_g, const Tensor& d_f,
                       const Tensor& d_A_log, const Tensor& d_dt_bias);

}  // namespace loom::cpu
