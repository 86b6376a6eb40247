// CPU implementation of kernels/kda_backward.h (contracts checked there).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace loom::cpu {

// dq and dk [T, Hk, dk] of key heads that Hv / Hk value heads share each: the sums of the value
// heads' shares dq_shares and dk_shares [Hv, T, dk], in value-head order (so the result does not
// depend on how threads computed the shares). Both delta-rule backwards (recurrent and chunked)
// end with it.
void sum_key_head_shares(const float* dq_shares, const float* dk_shares, int64_t T, int64_t Hk,
                         int64_t Hv, int64_t dk, float* dq, float* d_k);

void kda_recurrent_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                            const Tensor& beta, float scale, const Tensor& initial_state,
                            const Tensor& d_out, const Tensor& d_final_state, const Tensor& dq,
                            const Tensor& dk, const Tensor& dv, const Tensor& dg,
                            const Tensor& dbeta, const Tensor& d_initial_state);

void kda_gate_backward(const Tensor& f, const Tensor& A_log, const Tensor& dt_bias,
                       float lower_bound, const Tensor& d_g, const Tensor& d_f,
                       const Tensor& d_A_log, const Tensor& d_dt_bias);

}  // namespace loom::cpu
