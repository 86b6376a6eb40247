// Device dispatch for kernels/moe.h. The forward ops (router, permute, grouped SwiGLU, combine)
// have CUDA twins (kernels/cuda/moe.h); the backwards are CPU only (issue 14's): a CUDA tensor
// there stops with a message naming the op. bf16 activations are the CUDA forward's: the CPU
// kernels and every backward take f32 only, and stop with a message naming the op otherwise.
#include "kernels/moe.h"

#include <cmath>
#include <initializer_list>
#include <utility>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/moe.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/backward.h"
#include "kernels/cuda/moe.h"
#endif

namespace loom {
namespace {

// Each named tensor contiguous f32, else abort naming the op and the tensor; `where` says what
// takes f32 only.
void check_f32(const char* op, const char* where,
               std::initializer_list<std::pair<const char*, const Tensor*>> args) {
  for (const auto& [name, t] : args) {
    LOOM_CHECK(t->dtype() == DType::kF32 && t->is_contiguous(),
               "%s: %s %s: %s takes contiguous f32 only (bf16 activations run on CUDA, forward "
               "only)",
               op, name, t->describe().c_str(), where);
  }
}

}  // namespace

void moe_route(const Exec& ex, const Tensor& logits, const Tensor& bias, const RouterParams& params,
               const Tensor& expert_ids, const Tensor& weights) {
  LOOM_ON_EXEC_DEVICE(ex, "moe_route", logits, bias, expert_ids, weights);
  if (ex.device.is_cpu()) {
    return cpu::moe_route(logits, bias, params, expert_ids, weights);
  }
#ifdef LOOM_WITH_CUDA
  return cuda::moe_route(ex, logits, bias, params, expert_ids, weights);
#else
  no_kernel_for(ex, "moe_route");
#endif
}

void moe_route_replay(const Exec& ex, const Tensor& logits, const Tensor& replay_ids,
                      const RouterParams& params, const Tensor& expert_ids, const Tensor& weights,
                      const Tensor& counts) {
  static constexpr const char* kOp = "moe_route_replay";
  LOOM_ON_EXEC_DEVICE(ex, kOp, logits, replay_ids, expert_ids, weights, counts);
  check_f32(kOp, "the router", {{"logits", &logits}, {"weights", &weights}});
  for (const Tensor* ids : {&replay_ids, &expert_ids})
    LOOM_CHECK(ids->dtype() == DType::kI32 && ids->is_contiguous(), "%s: ids %s", kOp,
               ids->describe().c_str());
  LOOM_CHECK(logits.ndim() == 2, "%s: logits %s", kOp, logits.describe().c_str());
  const int64_t t = logits.dim(0), e = logits.dim(1);
  LOOM_CHECK(params.top_k >= 1 && params.top_k <= e, "%s: top_k=%d with %d experts", kOp,
             params.top_k, e);
  LOOM_CHECK_SHAPE(replay_ids, t, params.top_k);
  LOOM_CHECK_SHAPE(expert_ids, t, params.top_k);
  LOOM_CHECK_SHAPE(weights, t, params.top_k);
  LOOM_CHECK(counts.dtype() == DType::kI64 && counts.is_contiguous() && counts.numel() == 2,
             "%s: counts %s", kOp, counts.describe().c_str());
  if (ex.device.is_cpu()) {
    return cpu::moe_route_replay(logits, replay_ids, params, expert_ids, weights, counts);
  }
#ifdef LOOM_WITH_CUDA
  return cuda::moe_route_replay(ex, logits, replay_ids, params, expert_ids, weights, counts);
#else
  no_kernel_for(ex, kOp);
#endif
}

void moe_route_backward(const Exec& ex, const Tensor& logits, const Tensor& expert_ids,
                        const RouterParams& params, const Tensor& d_weights,
                        const Tensor& d_logits) {
  static constexpr const char* kOp = "moe_route_backward";
  LOOM_ON_EXEC_DEVICE(ex, kOp, logits, expert_ids, d_weights, d_logits);
  for (const Tensor* t : {&logits, &d_weights, &d_logits}) LOOM_CHECK_F32(*t);
  LOOM_CHECK(logits.ndim() == 2 && expert_ids.dtype() == DType::kI32 &&
                 expert_ids.is_contiguous() && expert_ids.ndim() == 2,
             "%s: logits %s expert_ids %s", kOp, logits.describe().c_str(),
             expert_ids.describe().c_str());
  const int64_t t = logits.dim(0), e = logits.dim(1);
  LOOM_CHECK(params.top_k >= 1 && params.top_k <= e, "%s: top_k=%d with %d experts", kOp,
             params.top_k, e);
  LOOM_CHECK_SHAPE(expert_ids, t, params.top_k);
  LOOM_CHECK_SHAPE(d_weights, t, params.top_k);
  LOOM_CHECK_SHAPE(d_logits, t, e);
  if (ex.device.is_cpu()) {
    return cpu::moe_route_backward(logits, expert_ids, params, d_weights, d_logits);
  }
#ifdef LOOM_WITH_CUDA
  return cuda::moe_route_backward(ex, logits, expert_ids, params, d_weights, d_logits);
#else
  no_kernel_for(ex, kOp);
#endif
}

void moe_aux_loss_forward_backward(const Exec& ex, const Tensor& logits, const Tensor& expert_ids,
                                   RouterScore score, float alpha, const Tensor& loss,
                                   const Tensor& d_logits) {
  static constexpr const char* kOp = "moe_aux_loss_forward_backward";
  LOOM_ON_EXEC_DEVICE(ex, kOp, logits, expert_ids, loss, d_logits);
  for (const Tensor* t : {&logits, &loss, &d_logits}) LOOM_CHECK_F32(*t);
  LOOM_CHECK(logits.ndim() == 2 && logits.dim(0) >= 1 && expert_ids.dtype() == DType::kI32 &&
                 expert_ids.is_contiguous() && expert_ids.ndim() == 2 &&
                 expert_ids.dim(0) == logits.dim(0) && expert_ids.dim(1) >= 1,
             "%s: logits %s expert_ids %s", kOp, logits.describe().c_str(),
             expert_ids.describe().c_str());
  LOOM_CHECK(std::isfinite(alpha) && alpha >= 0.0f, "%s: alpha %g", kOp, alpha);
  LOOM_CHECK_SHAPE(loss, 1);
  LOOM_CHECK_SHAPE(d_logits, logits.dim(0), logits.dim(1));
  if (ex.device.is_cpu()) {
    return cpu::moe_aux_loss_forward_backward(logits, expert_ids, score, alpha, loss, d_logits);
  }
#ifdef LOOM_WITH_CUDA
  return cuda::moe_aux_loss_forward_backward(ex, logits, expert_ids, score, alpha, loss, d_logits);
#else
  no_kernel_for(ex, kOp);
#endif
}

void moe_permute(const Exec& ex, const Tensor& x, const Tensor& expert_ids, int64_t first_expert,
                 int64_t num_experts, const Tensor& offsets, const Tensor& row_of_slot,
                 const Tensor& x_sorted) {
  LOOM_ON_EXEC_DEVICE(ex, "moe_permute", x, expert_ids, offsets, row_of_slot, x_sorted);
  if (ex.device.is_cpu()) {
    check_f32("moe_permute", "the CPU kernel", {{"x", &x}, {"x_sorted", &x_sorted}});
    return cpu::moe_permute(x, expert_ids, first_expert, num_experts, offsets, row_of_slot,
                            x_sorted);
  }
#ifdef LOOM_WITH_CUDA
  return cuda::moe_permute(ex, x, expert_ids, first_expert, num_experts, offsets, row_of_slot,
                           x_sorted);
#else
  no_kernel_for(ex, "moe_permute");
#endif
}

void moe_permute_backward(const Exec& ex, const Tensor& d_x_sorted, const Tensor& row_of_slot,
                          const Tensor& d_x) {
  static constexpr const char* kOp = "moe_permute_backward";
  LOOM_ON_EXEC_DEVICE(ex, kOp, d_x_sorted, row_of_slot, d_x);
  check_f32(kOp, "the backward", {{"d_x_sorted", &d_x_sorted}, {"d_x", &d_x}});
  LOOM_CHECK(d_x_sorted.ndim() == 2 && d_x.ndim() == 2 && row_of_slot.ndim() == 2 &&
                 row_of_slot.dtype() == DType::kI32 && row_of_slot.is_contiguous() &&
                 row_of_slot.dim(0) == d_x.dim(0) && d_x_sorted.dim(1) == d_x.dim(1),
             "%s: d_x_sorted %s row_of_slot %s d_x %s", kOp, d_x_sorted.describe().c_str(),
             row_of_slot.describe().c_str(), d_x.describe().c_str());
  if (ex.device.is_cpu()) {
    return cpu::moe_permute_backward(d_x_sorted, row_of_slot, d_x);
  }
#ifdef LOOM_WITH_CUDA
  return cuda::moe_permute_backward(ex, d_x_sorted, row_of_slot, d_x);
#else
  no_kernel_for(ex, kOp);
#endif
}

void moe_grouped_swiglu(const Exec& ex, const Tensor& x, const Tensor& offsets,
                        const Tensor& w_gate, const Tensor& w_up, const Tensor& w_down,
                        const Tensor& y, const Tensor& gate_up) {
  LOOM_ON_EXEC_DEVICE(ex, "moe_grouped_swiglu", x, offsets, w_gate, w_up, w_down, y, gate_up);
  LOOM_CHECK(offsets.dtype() == DType::kI32 && offsets.is_contiguous(),
             "moe_grouped_swiglu: offsets %s", offsets.describe().c_str());
  const DType wt = w_gate.dtype();
  for (const Tensor* w : {&w_gate, &w_up, &w_down}) {
    LOOM_CHECK((wt == DType::kF32 || wt == DType::kBF16 || wt == DType::kF8E4M3) &&
                   w->dtype() == wt && w->is_contiguous(),
               "moe_grouped_swiglu: expert weights must be contiguous f32, bf16 or fp8, all one "
               "dtype: w_gate %s w_up %s w_down %s",
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
  if (gate_up.defined()) {
    LOOM_CHECK_F32(gate_up);
    LOOM_CHECK_SHAPE(gate_up, 2, r, inter);
  }
  if (ex.device.is_cpu()) {
    check_f32("moe_grouped_swiglu", "the CPU kernel", {{"x", &x}, {"y", &y}});
    const cpu::RowInvariantScope numerics(ex.batch_invariant);
    return cpu::moe_grouped_swiglu(x, offsets, w_gate, w_up, w_down, y, gate_up);
  }
#ifdef LOOM_WITH_CUDA
  return cuda::moe_grouped_swiglu(ex, x, offsets, w_gate, w_up, w_down, y, gate_up);
#else
  no_kernel_for(ex, "moe_grouped_swiglu");
#endif
}

void moe_grouped_swiglu_backward(const Exec& ex, const Tensor& x, const Tensor& offsets,
                                 const Tensor& w_gate, const Tensor& w_up, const Tensor& w_down,
                                 const Tensor& gate_up, const Tensor& d_y, const Tensor& d_x,
                                 const Tensor& d_w_gate, const Tensor& d_w_up,
                                 const Tensor& d_w_down) {
  static constexpr const char* kOp = "moe_grouped_swiglu_backward";
  LOOM_ON_EXEC_DEVICE(ex, kOp, x, offsets, w_gate, w_up, w_down, gate_up, d_y, d_x);
  LOOM_ON_EXEC_DEVICE(ex, kOp, d_w_gate, d_w_up, d_w_down);
  LOOM_CHECK(
      w_gate.dtype() == DType::kF32 && w_up.dtype() == DType::kF32 && w_down.dtype() == DType::kF32,
      "%s: training needs f32 expert weights (load the model with an f32 placement): "
      "w_gate %s w_up %s w_down %s",
      kOp, w_gate.describe().c_str(), w_up.describe().c_str(), w_down.describe().c_str());
  check_f32(kOp, "the backward",
            {{"x", &x},
             {"w_gate", &w_gate},
             {"w_up", &w_up},
             {"w_down", &w_down},
             {"d_y", &d_y},
             {"d_x", &d_x},
             {"d_w_gate", &d_w_gate},
             {"d_w_up", &d_w_up},
             {"d_w_down", &d_w_down}});
  LOOM_CHECK(offsets.dtype() == DType::kI32 && offsets.is_contiguous(), "%s: offsets %s", kOp,
             offsets.describe().c_str());
  LOOM_CHECK(x.ndim() == 2 && w_gate.ndim() == 3, "%s: x %s w_gate %s", kOp, x.describe().c_str(),
             w_gate.describe().c_str());
  const int64_t r = x.dim(0), d = x.dim(1);
  const int64_t ne = w_gate.dim(0), inter = w_gate.dim(1);
  LOOM_CHECK_SHAPE(offsets, ne + 1);
  LOOM_CHECK_SHAPE(w_gate, ne, inter, d);
  LOOM_CHECK_SHAPE(w_up, ne, inter, d);
  LOOM_CHECK_SHAPE(w_down, ne, d, inter);
  LOOM_CHECK_SHAPE(d_w_gate, ne, inter, d);
  LOOM_CHECK_SHAPE(d_w_up, ne, inter, d);
  LOOM_CHECK_SHAPE(d_w_down, ne, d, inter);
  LOOM_CHECK_SHAPE(d_y, r, d);
  LOOM_CHECK_SHAPE(d_x, r, d);
  if (gate_up.defined()) {
    LOOM_CHECK_F32(gate_up);
    LOOM_CHECK_SHAPE(gate_up, 2, r, inter);
  }
  if (ex.device.is_cpu()) {
    const cpu::RowInvariantScope numerics(ex.batch_invariant);
    return cpu::moe_grouped_swiglu_backward(x, offsets, w_gate, w_up, w_down, gate_up, d_y, d_x,
                                            d_w_gate, d_w_up, d_w_down);
  }
#ifdef LOOM_WITH_CUDA
  return cuda::moe_grouped_swiglu_backward(ex, x, offsets, w_gate, w_up, w_down, gate_up, d_y, d_x,
                                           d_w_gate, d_w_up, d_w_down);
#else
  no_kernel_for(ex, kOp);
#endif
}

void moe_unpermute_combine(const Exec& ex, const Tensor& y, const Tensor& row_of_slot,
                           const Tensor& weights, const Tensor& out, const Tensor& addend) {
  LOOM_ON_EXEC_DEVICE(ex, "moe_unpermute_combine", y, row_of_slot, weights, out);
  if (addend.defined()) {
    LOOM_ON_EXEC_DEVICE(ex, "moe_unpermute_combine", addend);
    LOOM_CHECK(
        addend.shape() == out.shape() && addend.dtype() == out.dtype() && addend.is_contiguous(),
        "moe_unpermute_combine: addend %s must be contiguous, of out's shape and dtype (%s)",
        addend.describe().c_str(), out.describe().c_str());
    // out is written while addend is read (a combine then add_inplace(out, out) would double it).
    LOOM_CHECK(addend.raw() != out.raw() || out.numel() == 0,
               "moe_unpermute_combine: addend aliases out");
  }
  if (ex.device.is_cpu()) {
    check_f32("moe_unpermute_combine", "the CPU kernel", {{"y", &y}, {"out", &out}});
    cpu::moe_unpermute_combine(y, row_of_slot, weights, out);
    if (addend.defined()) cpu::add_inplace(out, addend);
    return;
  }
#ifdef LOOM_WITH_CUDA
  return cuda::moe_unpermute_combine(ex, y, row_of_slot, weights, out, addend);
#else
  no_kernel_for(ex, "moe_unpermute_combine");
#endif
}

void moe_unpermute_combine_backward(const Exec& ex, const Tensor& y, const Tensor& row_of_slot,
                                    const Tensor& weights, const Tensor& d_out, const Tensor& d_y,
                                    const Tensor& d_weights) {
  static constexpr const char* kOp = "moe_unpermute_combine_backward";
  LOOM_ON_EXEC_DEVICE(ex, kOp, y, row_of_slot, weights, d_out, d_y, d_weights);
  check_f32(kOp, "the backward",
            {{"y", &y},
             {"weights", &weights},
             {"d_out", &d_out},
             {"d_y", &d_y},
             {"d_weights", &d_weights}});
  LOOM_CHECK(y.ndim() == 2 && d_out.ndim() == 2 && row_of_slot.ndim() == 2 &&
                 row_of_slot.dtype() == DType::kI32 && row_of_slot.is_contiguous() &&
                 y.dim(1) == d_out.dim(1),
             "%s: y %s row_of_slot %s d_out %s", kOp, y.describe().c_str(),
             row_of_slot.describe().c_str(), d_out.describe().c_str());
  const int64_t t = d_out.dim(0), k = row_of_slot.dim(1);
  LOOM_CHECK_SHAPE(row_of_slot, t, k);
  LOOM_CHECK_SHAPE(weights, t, k);
  LOOM_CHECK_SHAPE(d_weights, t, k);
  LOOM_CHECK_SHAPE(d_y, y.dim(0), y.dim(1));
  if (ex.device.is_cpu()) {
    return cpu::moe_unpermute_combine_backward(y, row_of_slot, weights, d_out, d_y, d_weights);
  }
#ifdef LOOM_WITH_CUDA
  return cuda::moe_unpermute_combine_backward(ex, y, row_of_slot, weights, d_out, d_y, d_weights);
#else
  no_kernel_for(ex, kOp);
#endif
}

}  // namespace loom
