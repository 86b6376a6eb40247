// Causal softmax attention for training (kernels/attention.h has the serving forms over caches):
// a forward that also returns each query's log-sum-exp, and the backward that uses it instead of
// keeping the [T, T] probabilities. GQA directly; MLA in its expanded form (the trainer forms
// k = [k_nope | k_rope broadcast over heads] and v per head, then splits dk).
//
// One sequence of T tokens, query i attends keys 0 .. i:
//   q: [T, Hq, d]; k: [T, Hkv, d]; v: [T, Hkv, dv]; Hq a multiple of Hkv (query head h reads kv
//   head h / (Hq / Hkv)); out: [T, Hq, dv]; lse: [T, Hq] f32, log sum_j exp(scale q_i . k_j).
#pragma once

#include "core/tensor.h"
#include "kernels/exec.h"

namespace loom {

void causal_attention_forward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                              float scale, const Tensor& out, const Tensor& lse);

// Gradients of out = causal_attention_forward(q, k, v, scale) given d_out and the forward's out
// and lse. dq, dk, dv have q's, k's and v's shapes and are overwritten; dk and dv sum over the
// query heads of a kv head in head order (the result does not depend on the thread count).
void causal_attention_backward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& out, const Tensor& lse, const Tensor& d_out,
                               float scale, const Tensor& dq, const Tensor& dk, const Tensor& dv);

// The same over the trainer's packed batch: sequence b is rows [cu_seqlens[b], cu_seqlens[b + 1])
// of every tensor, and a query attends only the keys of its own sequence (up to itself).
// cu_seqlens: i64 [B + 1] on ex's device, 0 first, N last, non-decreasing; max_seqlen: at least
// every sequence's length (the host's copy; CUDA sizes its shared memory by it). Each sequence's
// rows get what the single-sequence call gives them: the CPU makes that call per sequence, CUDA one
// launch whose blocks each do one row's work of it.
void causal_attention_varlen_forward(const Exec& ex, const Tensor& q, const Tensor& k,
                                     const Tensor& v, const Tensor& cu_seqlens, int64_t max_seqlen,
                                     float scale, const Tensor& out, const Tensor& lse);
void causal_attention_varlen_backward(const Exec& ex, const Tensor& q, const Tensor& k,
                                      const Tensor& v, const Tensor& cu_seqlens, int64_t max_seqlen,
                                      const Tensor& out, const Tensor& lse, const Tensor& d_out,
                                      float scale, const Tensor& dq, const Tensor& dk,
                                      const Tensor& dv);

}  // namespace loom
