// The sequence-ordered half shared by the KDA and Gated DeltaNet mixers: the short convolution
// over q|k|v with each sequence's conv state, and the delta-rule recurrence with each sequence's
// recurrent state, each one varlen kernel call over the layer's whole batch and state pools.
#pragma once

#include "core/tensor.h"
#include "engine/model/layers.h"

namespace loom {

// Convolves qkv ([N, 2*Hk*dk + Hv*dv], rows of all sequences) per sequence with SiLU, then splits
// into q, k ([N, Hk, dk], L2-normalised as the reference does) and v ([N, Hv, dv]).
void linear_attention_conv_qkv(const ForwardContext& ctx, const Tensor& qkv,
                               const Tensor& conv_weight, int layer, const Tensor& q,
                               const Tensor& k, const Tensor& v);

// Runs the delta rule per sequence: the chunked form for prefill chunks, the token recurrence for
// a few tokens (decode) and in batch-invariant mode (kda_varlen_takes_recurrence).
// g: [N, Hv, dk] or [N, Hv, 1]; beta: [N, Hv]; o: [N, Hv, dv].
void linear_attention_delta_rule(const ForwardContext& ctx, const Tensor& q, const Tensor& k,
                                 const Tensor& v, const Tensor& g, const Tensor& beta, int layer,
                                 const Tensor& o);

}  // namespace loom
