// CPU implementations of kernels/moe.h (same contracts).
#pragma once

#include "core/tensor.h"
#include "kernels/moe.h"

namespace loom::cpu {

void moe_route(const Tensor& logits, const Tensor& bias, const RouterParams& params,
               const Tensor& expert_ids, const Tensor& weights);
void moe_permute(const Tensor& x, const Tensor& expert_ids, int64_t first_expert,
                 int64_t num_experts, const Tensor& offsets, const Tensor& row_of_slot,
                 const Tensor& x_sorted);
void moe_grouped_swiglu(const Tensor& x, const Tensor& offsets, const Tensor& w_gate,
                        const Tensor& w_up, const Tensor& w_down, const Tensor& y);
void moe_unpermute_combine(const Tensor& y, const Tensor& row_of_slot, const Tensor& weights,
                           const Tensor& out);

}  // namespace loom::cpu
