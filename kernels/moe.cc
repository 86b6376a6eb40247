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

void moe_permute(const Exec& ex, const Tensor& x, const Tensor& expert_ids, int64_t first_expert,
                 int64_t num_experts, const Tensor& offsets, const Tensor& row_of_slot,
                 const Tensor& x_sorted) {
  LOOM_ON_EXEC_DEVICE(ex, "moe_permute", x, expert_ids, offsets, row_of_slot, x_sorted);
  if (ex.device.is_cpu()) {
    return cpu::moe_permute(x, expert_ids, first_expert, num_experts, offsets, row_of_slot,
                            x_sorted);
  }
  no_kernel_for(ex, "moe_permute");
}

void moe_grouped_swiglu(const Exec& ex, const Tensor& x, const Tensor& offsets,
                        const Tensor& w_gate, const Tensor& w_up, const Tensor& w_down,
                        const Tensor& y) {
  LOOM_ON_EXEC_DEVICE(ex, "moe_grouped_swiglu", x, offsets, w_gate, w_up, w_down, y);
  LOOM_CHECK_F32(x);
  LOOM_CHECK_F32(y);
  LOOM_CHECK(offsets.dtype() == DType::kI32 && offsets.is_contiguous(),
             "moe_grouped_swiglu: offsets %s", offsets.describe().c_str());
  const DType wt = w_gate.dtype();
  for (const Tensor* w : {&w_gate, &w_up, &w_down}) {
    LOOM_CHECK((wt == DType::kF32 || wt == DType::kBF16) && w->dtype() == wt && w->is_contiguous(),
               "moe_grouped_swiglu: expert weights must be contiguous f32 or bf16, all one dtype: "
               "w_gate %s w_up %s w_down %s",
               w_gate.describe().c_str(), w_up.describe().c_str(), w_down.describe().c_str());
  }
  LOOM_CHECK(x.ndim() == 2 && w_gate.ndim() == 3, "moe_grouped_swiglu: x %s w_gate %s",
             x.describe().c_str(), w_gate.describe().c_str());
  const int64_t r = x.dim(0), d = x.dim(1);
  const int64_t ne = w_gate.dim(0), inter = w_gate.dim(1);
  LOOM_CHECK_SHAPE(offsets, ne + 1);
  LOOM_CHECK_SHAPE(w_gate, ne, inter, d);
  LOOM_CHECK_SHAPE(w_up, ne, inter, d);
  LOOM_CHECK_SHAPE(w_down, ne, d, inter);
  LOOM_CHECK_SHAPE(y, r, d);
  if (ex.device.is_cpu()) {
    const cpu::RowInvariantScope numerics(ex.batch_invariant);
    return cpu::moe_grouped_swiglu(x, offsets, w_gate, w_up, w_down, y);
  }
  no_kernel_for(ex, "moe_grouped_swiglu");
}

void moe_unpermute_combine(const Exec& ex, const Tensor& y, const Tensor& row_of_slot,
                           const Tensor& weights, const Tensor& out) {
  LOOM_ON_EXEC_DEVICE(ex, "moe_unpermute_combine", y, row_of_slot, weights, out);
  if (ex.device.is_cpu()) {
    return cpu::moe_unpermute_combine(y, row_of_slot, weights, out);
  }
  no_kernel_for(ex, "moe_unpermute_combine");
}

}  // namespace loom
