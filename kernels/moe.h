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
// Ties break towards the lower expert index, like torch.topk on CPU.
void moe_route(const Exec& ex, const Tensor& logits, const Tensor& bias, const RouterParams& params,
               const Tensor& expert_ids, const Tensor& weights);

// An MoE layer's routed experts run as permute -> grouped expert GEMMs -> unpermute and combine.
// A (token, choice) pair is a "slot", numbered t * K + i. Expert parallelism splits the chain
// between ranks (engine/parallel/expert_dispatcher.h): each rank runs the grouped GEMMs of the
// experts it owns, so the ops below take an owned range [first_expert, first_expert + E_local) and
// the weights of those experts only. Indices are i32 tensors, so that a device twin needs no host
// round trip and the step's addresses stay fixed.

// Groups the slots routed to the owned experts by expert; within an expert, rows keep slot order,
// so the grouping (and the GEMMs run on it) does not depend on the thread count.
// x: [T, D]; expert_ids: [T, K] i32 in [0, num_experts);
// offsets: [E_local + 1] i32 (written): owned expert first_expert + e has rows
//   [offsets[e], offsets[e + 1]) of x_sorted; offsets[0] = 0, offsets[E_local] = rows kept;
// row_of_slot: [T, K] i32 (written): the row of x_sorted holding slot (t, i), or -1 when its
//   expert is not owned;
// x_sorted: [R, D] with R >= rows kept (written up to offsets[E_local]; later rows untouched).
void moe_permute(const Exec& ex, const Tensor& x, const Tensor& expert_ids, int64_t first_expert,
                 int64_t num_experts, const Tensor& offsets, const Tensor& row_of_slot,
                 const Tensor& x_sorted);

// y[r] = down_e(silu(gate_e(x[r])) * up_e(x[r])) for each owned expert e's rows
// r in [offsets[e], offsets[e + 1]): one GEMM per projection per expert over its rows.
// x, y: [R, D] f32 (y's rows from offsets[E_local] on untouched); offsets: [E_local + 1] i32,
// non-decreasing; w_gate, w_up: [E_local, I, D]; w_down: [E_local, D, I], all three f32 or all
// bf16 (widened to f32 and accumulated in f32, as linear_forward does: the same bits as f32
// weights of the same values in batch-invariant mode, within f32 rounding otherwise).
void moe_grouped_swiglu(const Exec& ex, const Tensor& x, const Tensor& offsets,
                        const Tensor& w_gate, const Tensor& w_up, const Tensor& w_down,
                        const Tensor& y);

// out[t] = sum over i = 0..K-1, in that order, of weights[t, i] * y[row_of_slot[t, i]], skipping
// slots with row -1 (another rank's experts); a token with none gets zeros. The fixed order makes
// each row independent of the batch around it.
// y: [R, D]; row_of_slot: [T, K] i32; weights: [T, K] f32; out: [T, D] (overwritten).
void moe_unpermute_combine(const Exec& ex, const Tensor& y, const Tensor& row_of_slot,
                           const Tensor& weights, const Tensor& out);

}  // namespace loom
