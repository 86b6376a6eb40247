// Contracts and device dispatch for kernels/optim.h.
#include "kernels/optim.h"

#include "kernels/cpu/optim.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/optim.h"
#endif

namespace loom {

void adamw_update(const Exec& ex, const AdamWStep& s, const Tensor& param, const Tensor& grad,
                  const Tensor& m, const Tensor& v) {
  static constexpr const char* kOp = "adamw_update";
  LOOM_ON_EXEC_DEVICE(ex, kOp, param, grad, m, v);
  for (const Tensor* t : {&param, &grad, &m, &v}) {
    LOOM_CHECK_F32(*t);
    LOOM_CHECK(t->shape() == param.shape(), "%s: %s vs param %s", kOp, t->describe().c_str(),
               param.describe().c_str());
  }
  LOOM_CHECK(s.step >= 1 && s.beta1 >= 0.0f && s.beta1 < 1.0f && s.beta2 >= 0.0f &&
                 s.beta2 < 1.0f && s.eps > 0.0f && s.lr >= 0.0f && s.weight_decay >= 0.0f,
             "%s: step %lld beta1 %g beta2 %g eps %g lr %g weight_decay %g", kOp,
             static_cast<long long>(s.step), s.beta1, s.beta2, s.eps, s.lr, s.weight_decay);
  if (ex.device.is_cpu()) return cpu::adamw_update(s, param, grad, m, v);
#ifdef LOOM_WITH_CUDA
  return cuda::adamw_update(ex, s, param, grad, m, v);
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
