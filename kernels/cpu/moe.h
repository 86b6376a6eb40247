// CPU implementations of kernels/moe.h (same contracts).
#pragma once

#include "core/tensor.h"
#include "kernels/moe.h"

namespace loom::cpu {

void moe_route(const Tensor& logits, const Tensor& bias, const RouterParams& params,
               const Tensor& expert_ids, const Tensor& weights);
void moe_experts_forward(const Tensor& x, const Tensor& expert_ids, const Tensor& weights,
                         const Tensor& w_gate, const Tensor& w_up, const Tensor& w_down,
                         const Tensor& out);

}  // namespace loom::cpu
