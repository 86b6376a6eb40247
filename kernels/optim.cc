// Contracts and device dispatch for kernels/optim.h.
#include "kernels/optim.h"

#include "kernels/cpu/optim.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/optim.h"
#endif

namespace loom {

namespace {

void check_adamw_tensors(const Exec& ex, const char* op, const Tensor& param, const Tensor& grad,
                         const Tensor& m, const Tensor& v) {
  LOOM_ON_EXEC_DEVICE(ex, op, param, grad, m, v);
  for (const Tensor* t : {&param, &grad, &m, &v}) {
    LOOM_CHECK_F32(*t);
    LOOM_CHECK(t->shape() == param.shape(), "%s: %s vs param %s", op, t->describe().c_str(),
               param.describe().c_str());
  }
}

void check_adamw_step(const char* op, const AdamWStep& s) {
  LOOM_CHECK(s.step >= 1 && s.beta1 >= 0.0f && s.beta1 < 1.0f && s.beta2 >= 0.0f &&
                 s.beta2 < 1.0f && s.eps > 0.0f && s.lr >= 0.0f && s.weight_decay >= 0.0f,
             "%s: step %lld beta1 %g beta2 %g eps %g lr %g weight_decay %g", op,
             static_cast<long long>(s.step), s.beta1, s.beta2, s.eps, s.lr, s.weight_decay);
}

}  // namespace

void adamw_update(const Exec& ex, const AdamWStep& s, const Tensor& param, const Tensor& grad,
                  const Tensor& m, const Tensor& v) {
  static constexpr const char* kOp = "adamw_update";
  check_adamw_tensors(ex, kOp, param, grad, m, v);
  check_adamw_step(kOp, s);
  if (ex.device.is_cpu()) return cpu::adamw_update(s, param, grad, m, v);
#ifdef LOOM_WITH_CUDA
  return cuda::adamw_update(ex, s, param, grad, m, v);
#else
  no_kernel_for(ex, kOp);
#endif
}

void adamw_update_many(const Exec& ex, const AdamWStep& s, std::span<const AdamWTensor> tensors,
                       const GradScale& scale) {
  static constexpr const char* kOp = "adamw_update_many";
  LOOM_ON_EXEC_DEVICE(ex, kOp, scale.sum_squares);
  LOOM_CHECK(scale.sum_squares.dtype() == DType::kF32 && scale.sum_squares.numel() == 1,
             "%s: sum_squares %s, want f32 [1]", kOp, scale.sum_squares.describe().c_str());
  LOOM_CHECK(scale.mean > 0 && scale.clip_norm >= 0, "%s: mean %g clip_norm %g", kOp, scale.mean,
             scale.clip_norm);
  check_adamw_step(kOp, s);
  for (const AdamWTensor& t : tensors) check_adamw_tensors(ex, kOp, t.param, t.grad, t.m, t.v);
  if (ex.device.is_cpu()) {
    AdamWStep each = s;
    each.grad_scale = static_cast<float>(
        clipped_grad_scale(scale.sum_squares.data<float>()[0], scale.mean, scale.clip_norm));
    for (const AdamWTensor& t : tensors) {
      each.weight_decay = t.decay ? s.weight_decay : 0.0f;
      cpu::adamw_update(each, t.param, t.grad, t.m, t.v);
    }
    return;
  }
#ifdef LOOM_WITH_CUDA
  return cuda::adamw_update_many(ex, s, tensors, scale);
#else
  no_kernel_for(ex, kOp);
#endif
}

void sum_of_squares(const Exec& ex, const Tensor& x, const Tensor& out) {
  static constexpr const char* kOp = "sum_of_squares";
  LOOM_ON_EXEC_DEVICE(ex, kOp, x, out);
  LOOM_CHECK_F32(x);
  LOOM_CHECK(out.dtype() == DType::kF32 && out.numel() == 1, "%s: out %s, want f32 [1]", kOp,
             out.describe().c_str());
  if (ex.device.is_cpu()) return cpu::sum_of_squares(x, out);
#ifdef LOOM_WITH_CUDA
  return cuda::sum_of_squares(ex, x, out);
#else
  no_kernel_for(ex, kOp);
#endif
}

}  // namespace loom
