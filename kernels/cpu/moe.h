// CPU implementations of kernels/moe.h (same contracts).
#pragma once

#include "core/tensor.h"
#include "kernels/moe.h"

namespace loom::cpu {

void moe_route(const Tensor& logits, const Tensor& bias, const RouterParams& params,
               const Tensor& expert_ids, const Tensor& weights);
void moe_route_replay(const Tensor& logits, const Tensor& replay_ids, const RouterParams& params,
                      const Tensor& expert_ids, const Tensor& weights, const Tensor& counts);
void moe_route_backward(const Tensor& logits, const Tensor& expert_ids, const RouterParams& params,
                        const Tensor& d_weights, const Tensor& d_logits);
void moe_aux_loss_forward_backward(const Tensor& logits, const Tensor& expert_ids,
                                   RouterScore score, float alpha, const Tensor& loss,
                                   const Tensor& d_logits);
void moe_permute(const Tensor& x, const Tensor& expert_ids, int64_t first_expert,
                 int64_t num_experts, const Tensor& offsets, const Tensor& row_of_slot,
                 const Tensor& x_sorted);
void moe_permute_backward(const Tensor& d_x_sorted, const Tensor& row_of_slot, const Tensor& d_x);
// Shapes and dtypes checked in kernels/moe.cc (gate_up may be undefined).
void moe_grouped_swiglu(const Tensor& x, const Tensor& offsets, const Tensor& w_gate,
                        const Tensor& w_up, const Tensor& w_down, const Tensor& y,
                        const Tensor& gate_up);
void moe_grouped_swiglu_backward(const Tensor& x, const Tensor& offsets, const Tensor& w_gate,
                                 const Tensor& w_up, const Tensor& w_down, const Tensor& gate_up,
                                 const Tensor& d_y, const Tensor& d_x, const Tensor& d_w_gate,
                                 const Tensor& d_w_up, const Tensor& d_w_down);
void moe_unpermute_combine(const Tensor& y, const Tensor& row_of_slot, const Tensor& weights,
                           const Tensor& out);
void moe_unpermute_combine_backward(const Tensor& y, const Tensor& row_of_slot,
                                    const Tensor& weights, const Tensor& d_out, const Tensor& d_y,
                                    const Tensor& d_weights);

}  // namespace loom::cpu
