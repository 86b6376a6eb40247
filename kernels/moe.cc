// Device dispatch for kernels/moe.h. CPU only: the CUDA MoE kernels (router, permute, grouped GEMM,
// combine) are issue 13's; a CUDA tensor here stops with a message naming the op.
#include "kernels/moe.h"

#include "kernels/cpu/moe.h"

namespace loom {

void moe_route(const Tensor& logits, const Tensor& bias, const RouterParams& params,
               const Tensor& expert_ids, const Tensor& weights) {
  if (logits.device() == Device::kCpu) {
    return cpu::moe_route(logits, bias, params, expert_ids, weights);
  }
  LOOM_CHECK(false, "moe_route: no CUDA kernel in this build yet (%s)", logits.describe().c_str());
}

void moe_experts_forward(const Tensor& x, const Tensor& expert_ids, const Tensor& weights,
                         const Tensor& w_gate, const Tensor& w_up, const Tensor& w_down,
                         const Tensor& out) {
  if (x.device() == Device::kCpu) {
    return cpu::moe_experts_forward(x, expert_ids, weights, w_gate, w_up, w_down, out);
  }
  LOOM_CHECK(false, "moe_experts_forward: no CUDA kernel in this build yet (%s)",
             x.describe().c_str());
}

}  // namespace loom
