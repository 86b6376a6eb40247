// CPU implementations of kernels/kda.h (same contracts).
#pragma once

#include "core/tensor.h"

namespace loom::cpu {

void kda_recurrent_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                           const Tensor& beta, float scale, const Tensor& state, const Tensor& out);
void kda_chunked_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                         const Tensor& beta, float scale, const Tensor& state, const Tensor& out);
void kda_varlen_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                        const Tensor& beta, float scale, const Tensor& states,
                        const Tensor& state_slots, const Tensor& cu_seqlens, bool batch_invariant,
                        const Tensor& out);
void kda_gate_forward(const Tensor& f, const Tensor& A_log, const Tensor& dt_bias,
                      float lower_bound, const Tensor& g);

}  // namespace loom::cpu
