// The tail both attention mixers share in training (GQA and MLA's expanded form): causal
// attention of each sequence of the packed batch (ctx.batch, one varlen call), the optional sigmoid
// output gate (gate_proj of the layer input) and the output projection, recomputed from q, k, v and
// then run backward.
#pragma once

#include <string>

#include "core/tensor.h"
#include "engine/model/forward_context.h"
#include "engine/model/gradients.h"

namespace loom {

struct AttentionTail {
  Tensor o, lse;   // [N, H, dv] attention outputs, [N, H] each query's log-sum-exp
  Tensor gate, y;  // [N, H * dv] the gate logits (undefined without a gate), o_proj's input
};

// Step memory of the caller's scope. q: [N, H, d]; k: [N, Hkv, d]; v: [N, Hkv, dv]; x: [N, D].
// In a training forward (ctx.tape) the attention outputs and log-sum-exps are recorded under
// kAttentionOut and kAttentionLse for `layer`; in its backward (ctx.kept holding them) they are
// taken from there instead of being computed again (the same bits: the same kernel on the same
// q, k, v).
inline constexpr const char* kAttentionOut = "attention_out";
inline constexpr const char* kAttentionLse = "attention_lse";
AttentionTail attention_tail_recompute(const ForwardContext& ctx, int layer, const Tensor& q,
                                       const Tensor& k, const Tensor& v, float scale,
                                       const Tensor& x, const Tensor& gate_proj);

// From d_out [N, D]: accumulates `prefix` + "o_proj.weight" (and "gate_proj.weight") into grads,
// writes d_q, d_k, d_v and, with a gate, d_x (the gate projection's share). Returns the beta the
// caller's next d_x contribution takes: 1 when d_x was written here, 0 otherwise.
float attention_tail_backward(const ForwardContext& ctx, const Tensor& q, const Tensor& k,
                              const Tensor& v, float scale, const Tensor& x,
                              const Tensor& gate_proj, const Tensor& o_proj,
                              const AttentionTail& tail, const Tensor& d_out, const Tensor& d_x,
                              const std::string& prefix, Gradients& grads, const Tensor& d_q,
                              const Tensor& d_k, const Tensor& d_v);

}  // namespace loom
