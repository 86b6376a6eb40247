// Device dispatch for kernels/moe.h. CPU only: the CUDA MoE kernels (router, permute, grouped GEMM,
// combine) are issue 13's; a CUDA tensor here stops with a message naming the op.
#include "kernels/moe.h"

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/moe.h"

namespace loom {

void moe_route(const Exec& ex, const Tensor& logits, const Tensor& bias, const RouterParams& params,
               const Tensor& expert_ids, const Tensor& weights) {
  LOOM_ON_EXEC_DEVICE(ex, "moe_route", logits, bias, expert_ids, weights);
  if (ex.device.is_cpu()) {
    return cpu::moe_route(logits, bias, params, expert_ids, weights);
  }
  no_kernel_for(ex, "moe_route");
}

void moe_experts_forward(const Exec& ex, const Tensor& x, const Tensor& expert_ids,
                         const Tensor& weights, const Tensor& w_gate, const Tensor& w_up,
                         const Tensor& w_down, const Tensor& out) {
  LOOM_ON_EXEC_DEVICE(ex, "moe_experts_forward", x, expert_ids, weights, w_gate, w_up, w_down, out);
  if (ex.device.is_cpu()) {
    const cpu::RowInvariantScope numerics(ex.batch_invariant);
    return cpu::moe_experts_forward(x, expert_ids, weights, w_gate, w_up, w_down, out);
  }
  no_kernel_for(ex, "moe_experts_forward");
}

}  // namespace loom
