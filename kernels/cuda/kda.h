// CUDA twins of the same-named kernels/ header: same contracts, every tensor argument on the GPU
// (contiguous; f32 unless said otherwise), enqueued on the Exec's stream without synchronising.
#pragma once

#include "core/tensor.h"
#include "kernels/cuda/check.h"
#include "kernels/exec.h"
#include "kernels/kda_decode_step.h"

namespace loom::cuda {

// dk <= 256 (state columns held in registers); any dv; Hv a multiple of Hk; g [T, Hv, dk] or
// [T, Hv, 1]. q, k, v and out may also be bf16 (all four; beta f32 or bf16; g and the state f32),
// with f32 arithmetic: the varlen recurrence of kernels/cuda/kda_chunked.h over one sequence.
void kda_recurrent_forward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                           const Tensor& g, const Tensor& beta, float scale, const Tensor& state,
                           const Tensor& out);
// dt_bias may be undefined (no bias).
void kda_gate_forward(const Exec& ex, const Tensor& f, const Tensor& A_log, const Tensor& dt_bias,
                      float lower_bound, const Tensor& g);
// One kernel (kernels/cuda/kda_decode_prep.cu, host side kernels/cuda/kda_fused.cc). qkv, q, k
// and v of one activation dtype, conv_states, f and beta each f32 or bf16; dk <= 256.
void kda_decode_prepare(const Exec& ex, const Tensor& qkv, const Tensor& conv_weight,
                        const Tensor& conv_states, const Tensor& state_slots, const Tensor& f,
                        const Tensor& A_log, const Tensor& dt_bias, float lower_bound, float qk_eps,
                        const Tensor& beta, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& g);
// One kernel (kernels/cuda/kda_gated_norm.cu), a warp a row.
void rmsnorm_gated_forward(const Exec& ex, const Tensor& x, const Tensor& w, float eps,
                           const Tensor& gate, const Tensor& out);

// kernels/kda_decode_step.h's fused kernel (kernels/cuda/kda_decode_step.cu): whether it applies
// (kda_decode_step_is_fused's conditions, on a CUDA exec), and the launch, which requires them.
bool kda_decode_step_applies(const Exec& ex, const KdaDecodeStep& s, const Tensor& out);
void kda_decode_step(const Exec& ex, const KdaDecodeStep& s, const Tensor& out);

}  // namespace loom::cuda
