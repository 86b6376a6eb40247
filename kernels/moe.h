// Mixture-of-experts routing and expert compute.
#pragma once

#include "core/tensor.h"
#include "kernels/exec.h"

namespace loom {

enum class RouterScore : uint8_t {
  kSigmoid,  // kimi_linear, deepseek_v3: s = sigmoid(logits); selection uses s + bias
  kSoftmax,  // qwen3_next: s = softmax(logits) over experts
};

struct RouterParams {
  RouterScore score = RouterScore::kSigmoid;
  int top_k = 1;
  int n_group = 1;          // experts split into n_group equal groups (1 = no grouping)
  int topk_group = 1;       // groups kept; a group's score is the sum of its top-2 biased scores;
                            // experts of dropped groups are masked with -inf before the top-k
  bool renormalize = true;  // sigmoid: w /= sum(w) + 1e-20 over the chosen experts (HF
                            // deepseek_v3 / kimi_linear); softmax: w /= sum(w), no epsilon
                            // (HF Qwen2MoeTopKRouter, which qwen3_next reuses)
  float routed_scaling = 1.0f;  // applied after renormalisation
};

// logits: [T, E] f32; bias: [E] f32 or undefined (selection only, never in the weights);
// expert_ids: [T, top_k] i32 (ordered by descending selection score); weights: [T, top_k] f32.
// Ties break towards the lower expert index, like torch.topk on CPU. A NaN logit's selection is
// unspecified (the CUDA kernel ranks NaN scores below every number; a model that produces them is
// broken either way).
void moe_route(const Exec& ex, const Tensor& logits, const Tensor& bias, const RouterParams& params,
               const Tensor& expert_ids, const Tensor& weights);

// Routing replay (RL, issue 20): rows of `replay_ids` whose first entry is >= 0 are routed to
// those experts instead of their own selection. For such a row t, expert_ids[t] = replay_ids[t]
// and weights[t] are recomputed from the logits by moe_route's formulas for those experts (the
// scores without the bias, renormalised and scaled, summed in slot order): the same bits as
// moe_route's when the replayed experts are the row's own in the same order. Other rows (first
// entry < 0) keep what expert_ids and weights hold (moe_route's output: call it first).
// logits: [T, E] f32; replay_ids: [T, K] i32, a replayed row's K entries in [0, E) and distinct
// (checked; abort otherwise: Model::forward validates what callers pass); expert_ids: [T, K] i32
// and weights: [T, K] f32, read and rewritten; counts: [2] i64 (written): slots replayed, and of
// those the ones whose expert is not among the row's own selection (what expert_ids held).
// CPU and CUDA (the CUDA twin reads the replayed ids without checking them: the caller validates
// them on the host, kernels/cuda/moe.h).
void moe_route_replay(const Exec& ex, const Tensor& logits, const Tensor& replay_ids,
                      const RouterParams& params, const Tensor& expert_ids, const Tensor& weights,
                      const Tensor& counts);

// Training: the gradient of moe_route's `weights` with respect to `logits`. The selection (top-k,
// groups, bias) is piecewise constant in the logits, so it is taken as given (the forward's
// expert_ids) and only the chosen experts' scores carry gradient; the bias gets none. With the
// chosen scores a_i = s[e_i], c = routed_scaling and, renormalised, w_i = c * a_i / S,
// S = sum_j a_j + eps (eps = 1e-20 for sigmoid, 0 for softmax, as the forward):
//   d_a_i = (c * d_w_i - sum_j d_w_j * w_j) / S      (renormalised; else d_a_i = c * d_w_i),
// d_s = d_a scattered to the chosen experts (zero elsewhere), then d_logits = s * (1 - s) * d_s
// (sigmoid: zero at unchosen experts) or s * (d_s - sum(s * d_s)) (softmax: every expert). The
// scores are recomputed from the logits by the forward's formulas; the sums run in f32, in order.
// logits: [T, E] f32; expert_ids: [T, K] i32 in [0, E) (the forward's); d_weights: [T, K] f32;
// d_logits: [T, E] f32 (written, every element; may be logits itself: a row is read before it is
// written). Rows are independent: the same bits for any thread count.
void moe_route_backward(const Exec& ex, const Tensor& logits, const Tensor& expert_ids,
                        const RouterParams& params, const Tensor& d_weights,
                        const Tensor& d_logits);

// Training: the auxiliary load-balancing loss of one MoE layer over the T rows of `logits` (Switch
// Transformer / GShard; DeepSeek-V3's sequence-wise form when the rows are one sequence), and its
// gradient with respect to the logits:
//   L = alpha * E * sum_e f_e * P_e,
//   f_e = (slots of expert_ids routed to e) / (T K): constant (the selection is piecewise
//         constant, so it carries no gradient; it counts the selection as made, bias included),
//   P_e = (1 / T) sum_t p[t, e], p the router's scores normalised over the experts: softmax(l)
//         for kSoftmax, s / sum_j s_j with s = sigmoid(l) for kSigmoid (DeepSeek-V3's s').
// L is alpha when the slots are spread evenly. With c_e = alpha * E * f_e / T = dL/dp[t, e]:
//   softmax: d_l[t, j] = p_j (c_j - sum_e p_e c_e);
//   sigmoid: d_l[t, j] = s_j (1 - s_j) (c_j - sum_e p_e c_e) / sum_i s_i.
// The selection bias takes no part in P and gets no gradient. logits: [T, E] f32; expert_ids:
// [T, K] i32 in [0, E) (the forward's); loss: [1] f32 (written: L, summed in double in row order);
// d_logits: [T, E] f32, ADDED to (moe_route_backward writes it first). Rows of d_logits are
// independent and the loss is summed in one fixed order: the same bits for any thread count.
void moe_aux_loss_forward_backward(const Exec& ex, const Tensor& logits, const Tensor& expert_ids,
                                   RouterScore score, float alpha, const Tensor& loss,
                                   const Tensor& d_logits);

// An MoE layer's routed experts run as permute -> grouped expert GEMMs -> unpermute and combine.
// A (token, choice) pair is a "slot", numbered t * K + i. Expert parallelism splits the chain
// between ranks (engine/parallel/expert_dispatcher.h): each rank runs the grouped GEMMs of the
// experts it owns, so the ops below take an owned range [first_expert, first_expert + E_local) and
// the weights of those experts only. Indices are i32 tensors, so that a device twin needs no host
// round trip and the step's addresses stay fixed.
// Activations (x, x_sorted, y, out below) are f32 on the CPU; on CUDA each is f32 or bf16 on its
// own (the model's are bf16): computed in f32, a bf16 output rounded to nearest even once. Router
// logits and weights stay f32, and the backwards take f32 only (training runs in f32).

// Groups the slots routed to the owned experts by expert; within an expert, rows keep slot order,
// so the grouping (and the GEMMs run on it) does not depend on the thread count.
// x: [T, D] (f32, or on CUDA bf16); expert_ids: [T, K] i32 in [0, num_experts);
// offsets: [E_local + 1] i32 (written): owned expert first_expert + e has rows
//   [offsets[e], offsets[e + 1]) of x_sorted; offsets[0] = 0, offsets[E_local] = rows kept;
// row_of_slot: [T, K] i32 (written): the row of x_sorted holding slot (t, i), or -1 when its
//   expert is not owned;
// x_sorted: [R, D] with R >= rows kept (written up to offsets[E_local]; later rows untouched);
//   f32 or, on CUDA, bf16: of x's dtype its rows are x's bits, else x's values converted.
void moe_permute(const Exec& ex, const Tensor& x, const Tensor& expert_ids, int64_t first_expert,
                 int64_t num_experts, const Tensor& offsets, const Tensor& row_of_slot,
                 const Tensor& x_sorted);

// Training: the backward of moe_permute at x: d_x[t] += sum over i = 0..K-1, in that order, of
// d_x_sorted[row_of_slot[t, i]], skipping rows of -1 (accumulated: the router's gradient or the
// shared expert's may already be there; one finished sum is added per element, and a token none of
// whose slots is owned is left as it is). The same bits for any thread count.
// d_x_sorted: [R, D] f32; row_of_slot: [T, K] i32 in [-1, R); d_x: [T, D] f32.
void moe_permute_backward(const Exec& ex, const Tensor& d_x_sorted, const Tensor& row_of_slot,
                          const Tensor& d_x);

// y[r] = down_e(silu(gate_e(x[r])) * up_e(x[r])) for each owned expert e's rows
// r in [offsets[e], offsets[e + 1]): one GEMM per projection per expert over its rows.
// x, y: [R, D] f32 (on CUDA either may be bf16; y's rows from offsets[E_local] on untouched);
// offsets: [E_local + 1] i32,
// non-decreasing; w_gate, w_up: [E_local, I, D]; w_down: [E_local, D, I], all three f32, all
// bf16 or, on the CPU, all stored FP8 (core/fp8_matrix.h: each expert's matrix in its own 128 x 128
// blocks) (widened to f32, FP8 times its block's scale, and accumulated in f32, as linear_forward
// does: the same bits as f32 weights of the same values in batch-invariant mode, within f32
// rounding otherwise).
// gate_up: undefined (the default), or [2, R, I] f32: training keeps the gate (gate_up[0]) and up
// (gate_up[1]) pre-activations of every row there for moe_grouped_swiglu_backward (rows from
// offsets[E_local] on untouched); y is the same bits either way.
void moe_grouped_swiglu(const Exec& ex, const Tensor& x, const Tensor& offsets,
                        const Tensor& w_gate, const Tensor& w_up, const Tensor& w_down,
                        const Tensor& y, const Tensor& gate_up = Tensor());

// Training: the backward of moe_grouped_swiglu given d_y, per owned expert over its rows:
//   d_h = d_y @ W_down;  d_W_down += d_y^T @ h;  (d_g, d_u) = silu_mul_backward(g, u, d_h);
//   d_x = d_g @ W_gate + d_u @ W_up;  d_W_gate += d_g^T @ x;  d_W_up += d_u^T @ x.
// x, offsets, w_*: as the forward, the weights f32 only (bf16 expert weights abort: train on an f32
// placement); gate_up: the forward's kept pre-activations [2, R, I], or undefined to recompute
// them (two more GEMMs per expert); d_y: [R, D]; d_x: [R, D] (written for rows
// [0, offsets[E_local]), later rows untouched); d_w_gate, d_w_up, d_w_down: shaped as the weights,
// accumulated. One GEMM per product per expert, experts in order: the same bits at a fixed
// OpenBLAS thread count. Batch-invariant mode aborts, as linear_backward does: the weight
// gradients' products transpose their left operand, which the row-invariant kernel does not take.
void moe_grouped_swiglu_backward(const Exec& ex, const Tensor& x, const Tensor& offsets,
                                 const Tensor& w_gate, const Tensor& w_up, const Tensor& w_down,
                                 const Tensor& gate_up, const Tensor& d_y, const Tensor& d_x,
                                 const Tensor& d_w_gate, const Tensor& d_w_up,
                                 const Tensor& d_w_down);

// out[t] = sum over i = 0..K-1, in that order, of weights[t, i] * y[row_of_slot[t, i]], skipping
// slots with row -1 (another rank's experts); a token with none gets zeros. The fixed order makes
// each row independent of the batch around it.
// y: [R, D]; row_of_slot: [T, K] i32; weights: [T, K] f32; out: [T, D] (overwritten); y and out
// f32 or, on CUDA, bf16 each (the sum runs in f32 in the same order; a bf16 out is rounded once).
// addend: undefined, or [T, D] of out's dtype, added to each finished (rounded) sum: the bits of
// this call without it followed by add_inplace(out, addend), in one pass (an MoE layer's shared
// expert output, one kernel fewer a layer at decode).
void moe_unpermute_combine(const Exec& ex, const Tensor& y, const Tensor& row_of_slot,
                           const Tensor& weights, const Tensor& out,
                           const Tensor& addend = Tensor());

// Training: the backward of moe_unpermute_combine given d_out [T, D]:
//   d_y[row_of_slot[t, i]] = weights[t, i] * d_out[t]   (written; rows no slot names untouched)
//   d_weights[t, i] = d_out[t] . y[row_of_slot[t, i]]   (written; 0 for a slot of row -1, so the
//                                                         shares of ranks covering every expert
//                                                         sum to the whole gradient)
// Dot products accumulate in double, in column order. y, d_y: [R, D]; row_of_slot: [T, K] i32, the
// owned slots' rows distinct (as moe_permute writes them); weights, d_weights: [T, K] f32.
void moe_unpermute_combine_backward(const Exec& ex, const Tensor& y, const Tensor& row_of_slot,
                                    const Tensor& weights, const Tensor& d_out, const Tensor& d_y,
                                    const Tensor& d_weights);

}  // namespace loom
