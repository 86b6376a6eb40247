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

// out[t] = sum_i weights[t, i] * down_e(silu(gate_e(x_t)) * up_e(x_t)), e = expert_ids[t, i].
// Tokens are grouped per expert so each expert runs one GEMM over its tokens.
// x: [T, D]; w_gate, w_up: [E, I, D]; w_down: [E, D, I]; out: [T, D] (overwritten).
void moe_experts_forward(const Exec& ex, const Tensor& x, const Tensor& expert_ids,
                         const Tensor& weights, const Tensor& w_gate, const Tensor& w_up,
                         const Tensor& w_down, const Tensor& out);

}  // namespace loom
