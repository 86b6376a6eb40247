// Device dispatch for kernels/norm.h.
#include "kernels/norm.h"

#include "kernels/cpu/norm.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/norm.h"
#endif

namespace loom {

void rmsnorm_forward(const Exec& ex, const Tensor& x, const Tensor& w, float eps,
                     float weight_offset, const Tensor& out) {
  LOOM_ON_EXEC_DEVICE(ex, "rmsnorm_forward", x, w, out);
  if (ex.device.is_cpu()) return cpu::rmsnorm_forward(x, w, eps, weight_offset, out);
#ifdef LOOM_WITH_CUDA
  return cuda::rmsnorm_forward(ex, x, w, eps, weight_offset, out);
#else
  no_kernel_for(ex, "rmsnorm_forward");
#endif
}

void l2norm_forward(const Exec& ex, const Tensor& x, float eps, float scale, const Tensor& out) {
  LOOM_ON_EXEC_DEVICE(ex, "l2norm_forward", x, out);
  if (ex.device.is_cpu()) return cpu::l2norm_forward(x, eps, scale, out);
#ifdef LOOM_WITH_CUDA
  return cuda::l2norm_forward(ex, x, eps, scale, out);
#else
  no_kernel_for(ex, "l2norm_forward");
#endif
}

}  // namespace loom
