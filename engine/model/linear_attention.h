// The sequence-ordered half shared by the KDA and Gated DeltaNet mixers: the short convolution
// over q|k|v with each sequence's conv state, and the delta-rule recurrence with each sequence's
// recurrent state, each one varlen kernel call over the layer's whole batch and state pools.
#pragma once

#include <vector>

#include "core/tensor.h"
#include "engine/model/layers.h"
#include "engine/model/training_batch.h"

namespace loom {

// Convolves qkv ([N, 2*Hk*dk + Hv*dv], rows of all sequences) per sequence with SiLU, then splits
// into q, k ([N, Hk, dk], L2-normalised as the reference does) and v ([N, Hv, dv]).
void linear_attention_conv_qkv(const ForwardContext& ctx, const Tensor& qkv,
                               const Tensor& conv_weight, int layer, const Tensor& q,
                               const Tensor& k, const Tensor& v);

// Whether this step is a pure decode batch of `rows` rows: every sequence exactly one new row
// (ctx.batch.max_seqlen == 1 and as many sequences as rows), so row b is sequence b.
bool linear_attention_is_decode(const ForwardContext& ctx, int64_t rows);

// A pure decode batch (linear_attention_is_decode) from the projections to the gated output norm:
// linear_attention_conv_qkv, the decay gate g = kda_gate_forward(f, A_log, dt_bias, lower_bound),
// beta = sigmoid(beta), linear_attention_delta_rule, then per (row, value head) RMSNorm(o) times
// sigmoid(gate) (KDA), or silu(gate) when gate_silu (GDN), into o, as one kda_decode_step
// (kernels/kda_decode_step.h: one kernel on CUDA, the bits of the separate ops).
// f: [N, Hv*dk] (or [N, Hv]: one decay per head); beta: [N, Hv], left unspecified; o: [N, Hv, dv];
// gate: o's numel; norm_weight: [dv].
void linear_attention_decode_step(const ForwardContext& ctx, const Tensor& qkv,
                                  const Tensor& conv_weight, int layer, const Tensor& f,
                                  const Tensor& A_log, const Tensor& dt_bias, float lower_bound,
                                  const Tensor& beta, const Tensor& norm_weight, float norm_eps,
                                  const Tensor& gate, bool gate_silu, const Tensor& o);

// Runs the delta rule per sequence: the chunked form for prefill chunks, the token recurrence for
// a few tokens (decode) and in batch-invariant mode (kda_varlen_takes_recurrence).
// g: [N, Hv, dk] or [N, Hv, 1]; beta: [N, Hv]; o: [N, Hv, dv].
void linear_attention_delta_rule(const ForwardContext& ctx, const Tensor& q, const Tensor& k,
                                 const Tensor& v, const Tensor& g, const Tensor& beta, int layer,
                                 const Tensor& o);

// Training (Mixer::backward): the same two halves over the packed batch of ctx.batch (sequence s in
// state slot s, every one from zero states), with what their backward needs kept, and their
// backward, each one varlen call over all the sequences.
//
// Recomputes the convolution of qkv and splits it: q_raw, k_raw [N, Hk, dk] (before the L2 norm),
// q, k (after it) and v [N, Hv, dv].
void linear_attention_conv_qkv_recompute(const ForwardContext& ctx, const Tensor& qkv,
                                         const Tensor& conv_weight, const Tensor& q_raw,
                                         const Tensor& k_raw, const Tensor& q, const Tensor& k,
                                         const Tensor& v);
// Backward of the above from d_q, d_k (overwritten: they become the gradients before the norm)
// and d_v: writes d_qkv [N, C] and accumulates d_conv_weight [C, W].
void linear_attention_conv_qkv_backward(const ForwardContext& ctx, const Tensor& qkv,
                                        const Tensor& conv_weight, const Tensor& q_raw,
                                        const Tensor& k_raw, const Tensor& d_q, const Tensor& d_k,
                                        const Tensor& d_v, const Tensor& d_qkv,
                                        const Tensor& d_conv_weight);
// The delta rule from zero states, as the forward ran it (the same kernel, so the same o), and its
// backward (kda_varlen_backward: on CUDA one chunked launch for the batch): d_o in, d_q, d_k, d_v,
// d_g, d_beta written.
void linear_attention_delta_rule_recompute(const ForwardContext& ctx, const Tensor& q,
                                           const Tensor& k, const Tensor& v, const Tensor& g,
                                           const Tensor& beta, const Tensor& o);
void linear_attention_delta_rule_backward(const ForwardContext& ctx, const Tensor& q,
                                          const Tensor& k, const Tensor& v, const Tensor& g,
                                          const Tensor& beta, const Tensor& d_o, const Tensor& d_q,
                                          const Tensor& d_k, const Tensor& d_v, const Tensor& d_g,
                                          const Tensor& d_beta);

}  // namespace loom
