// Delta-rule linear attention with decay: KDA (per-channel decay) and Gated DeltaNet (scalar decay
// per head), one sequence at a time or a whole varlen batch against a pool of states.
//
// Shapes (one sequence of T tokens):
//   q, k:  [T, Hk, dk]   already L2-normalised (see l2norm_forward); q is scaled by `scale` here
//   v:     [T, Hv, dv]   Hv a multiple of Hk; value head h reads key head h / (Hv / Hk)
//   g:     [T, Hv, dk]   per-channel log decay (KDA), or [T, Hv, 1] one per head (GDN); all <= 0
//   beta:  [T, Hv]
//   state: [Hv, dk, dv]  f32, updated in place (the state layout of every linear layer)
//   out:   [T, Hv, dv]   must not alias any input
// Dtypes: f32. On CUDA the forwards also take bf16 activations: q, k, v and out all bf16, beta f32
// or bf16; g and the states stay f32 and the arithmetic is f32 (bf16 outputs are rounded to
// nearest even). The CPU kernels and every backward are f32 only.
// The recurrence, per value head and token t:
//   S = diag(exp(g_t)) S;  S += k_t (beta_t (v_t - S^T k_t))^T;  o_t = S^T (scale * q_t)
#pragma once

#include "core/tensor.h"
#include "kernels/exec.h"

namespace loom {

// The token-by-token recurrence: the reference, and the decode path (T small).
void kda_recurrent_forward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                           const Tensor& g, const Tensor& beta, float scale, const Tensor& state,
                           const Tensor& out);

// Chunked (WY/UT) form, chunk of kKdaChunk tokens in 16-token sub-chunks; equals
// kda_recurrent_forward to f32 rounding for any T (not only multiples of the chunk) and any decay
// in the bounded or softplus range. It never forms exp(-cumsum g) over a chunk: cross-sub-chunk
// factors are exponent differences <= 0, and the diagonal 16x16 blocks factor through a local
// reference point only when every channel decays by at most 80 nats across the sub-chunk (so no
// factor exceeds e^80), falling back to element-wise exp(gc_t - gc_s) <= 1 otherwise.
inline constexpr int kKdaChunk = 64;
void kda_chunked_forward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& g, const Tensor& beta, float scale, const Tensor& state,
                         const Tensor& out);

// The delta rule over the whole varlen batch of a layer in one call, each sequence against its
// own state in a pool of slots. Sequence b is rows [cu_seqlens[b], cu_seqlens[b + 1]) of q, k, v,
// g, beta and out, and its state is states[state_slots[b]]; it runs kda_recurrent_forward when
// kda_varlen_takes_recurrence(its length, ex.batch_invariant), kda_chunked_forward otherwise, with
// exactly that form's result.
// q, k, v, g, beta, out: as above with T = N rows; states: [num_slots, Hv, dk, dv] f32 (the named
// slots updated in place; no slot named twice); state_slots: i32 [B]; cu_seqlens: i64 [B + 1], 0
// first, N last, non-decreasing.
// max_seqlen: an upper bound on every sequence's length that the caller knows on the host, or 0
// for none (cu_seqlens may live on the device, where the host cannot read it). It changes no
// result, only which kernels run: on CUDA, 1 with N == B (a decode step) runs one batched decode
// launch, and <= kKdaRecurrentMaxTokens skips the chunked launches. The CPU checks it.
// With bf16 activations on CUDA the chunked form runs its products on tensor cores (bf16 operands,
// f32 accumulation; kernels/cuda/kda_chunked.h); the recurrence and decode keep f32 arithmetic.
void kda_varlen_forward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& g, const Tensor& beta, float scale, const Tensor& states,
                        const Tensor& state_slots, const Tensor& cu_seqlens, const Tensor& out,
                        int64_t max_seqlen = 0);

// Up to this many new tokens the recurrence beats the chunked form's fixed per-chunk work.
inline constexpr int64_t kKdaRecurrentMaxTokens = 8;
// The form kda_varlen_forward runs for a sequence of `tokens` new rows. The recurrence's result
// for a token does not depend on how the sequence was cut into calls; the chunked form's does
// (where its chunks start), so batch-invariant numerics never take it.
inline bool kda_varlen_takes_recurrence(int64_t tokens, bool batch_invariant) {
  return tokens <= kKdaRecurrentMaxTokens || batch_invariant;
}

// Decay gates from the raw projection f ([T, H * dk] or [T, H] for GDN; dt_bias has f's width):
//   lower_bound == 0 (softplus form):  g = -exp(A_log[h]) * softplus(f + dt_bias)
//   lower_bound < 0  (bounded form):   g = lower_bound * sigmoid(exp(A_log[h]) * (f + dt_bias))
// A_log: [H]; dt_bias: same width as f (or undefined for none); g: same shape as f (2-D; the
// recurrence takes the GDN form as [T, H, 1], a reshape of this output).
void kda_gate_forward(const Exec& ex, const Tensor& f, const Tensor& A_log, const Tensor& dt_bias,
                      float lower_bound, const Tensor& g);

// A decode step's inputs to the delta rule for B sequences of one new token each (row b is
// sequence b): what a KDA (or, with one decay per head, Gated DeltaNet) layer runs between its
// projections and kda_varlen_forward, fused.
//   conv = SiLU(the short convolution of qkv against conv_states[state_slots[b]]), the state
//          moved along as causal_conv1d_varlen moves it;
//   q = l2norm(conv[:, 0:ck]), k = l2norm(conv[:, ck:2ck]) per head (eps qk_eps, scale 1);
//   v = conv[:, 2ck:];  g = kda_gate_forward(f, A_log, dt_bias, lower_bound);
//   beta = sigmoid(beta), in place.
// The bits of causal_conv1d_varlen (into a conv_out of q's dtype), copy_columns, l2norm_forward,
// kda_gate_forward and sigmoid_inplace run one after another; on CUDA one kernel.
// qkv: [B, C] with C = 2 Hk dk + Hv dv; conv_weight: [C, W] f32; conv_states: [num_slots, W-1, C];
// state_slots: i32 [B], distinct but for the scratch slot (CacheStore::kScratchSlot, which the
// engine's captured graphs point their filler rows at: several may share it, and what they leave
// there is never read by a real row); f: [B, Hv dk] (or [B, Hv]: GDN's decay per head); A_log:
// [Hv]; dt_bias: f's width or undefined; beta: [B, Hv]; q, k: [B, Hk, dk]; v: [B, Hv, dv]; g: f32,
// f's numel ([B, Hv, dk] or [B, Hv, 1]).
// Dtypes: f32 on the CPU. On CUDA qkv, q, k and v share one activation dtype (f32 or bf16),
// conv_states, f and beta are each f32 or bf16, and dk <= 256.
// A negative slot marks a padding row for callers that pad with -1 (kda_varlen_forward's decode
// takes them the same way; the engine pads with the scratch slot instead): its conv state is not
// touched and its q, k and v rows are zero; its g and beta rows are computed as any row's.
// (causal_conv1d_varlen itself takes no negative slot.)
void kda_decode_prepare(const Exec& ex, const Tensor& qkv, const Tensor& conv_weight,
                        const Tensor& conv_states, const Tensor& state_slots, const Tensor& f,
                        const Tensor& A_log, const Tensor& dt_bias, float lower_bound, float qk_eps,
                        const Tensor& beta, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& g);

// out = RMSNorm(x) * sigmoid(gate) row by row: KDA's gated per-head output norm in one pass, with
// the bits of rmsnorm_forward(x, w, eps, 0, out) followed by mul_sigmoid_inplace(out, gate).
// x, out: [..., D] contiguous, f32 or (CUDA) bf16 each, out may alias x (same dtype); w: [D] f32;
// gate: x's numel, f32 or (CUDA) bf16 (element i gates element i).
void rmsnorm_gated_forward(const Exec& ex, const Tensor& x, const Tensor& w, float eps,
                           const Tensor& gate, const Tensor& out);

}  // namespace loom
