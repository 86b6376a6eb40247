// Device dispatch for kernels/norm.h.
#include "kernels/norm.h"

#include "kernels/cpu/norm.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/norm.h"
#endif

namespace loom {

void rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, float weight_offset,
                     const Tensor& out) {
#ifdef LOOM_WITH_CUDA
  LOOM_CHECK_SAME_DEVICE("rmsnorm_forward", x, w, out);
#endif
  if (x.device() == Device::kCpu) return cpu::rmsnorm_forward(x, w, eps, weight_offset, out);
#ifdef LOOM_WITH_CUDA
  return cuda::rmsnorm_forward(x, w, eps, weight_offset, out);
#else
  LOOM_CHECK(false, "rmsnorm_forward: %s tensor in a build without CUDA", x.describe().c_str());
#endif
}

void l2norm_forward(const Tensor& x, float eps, float scale, const Tensor& out) {
#ifdef LOOM_WITH_CUDA
  LOOM_CHECK_SAME_DEVICE("l2norm_forward", x, out);
#endif
  if (x.device() == Device::kCpu) return cpu::l2norm_forward(x, eps, scale, out);
#ifdef LOOM_WITH_CUDA
  return cuda::l2norm_forward(x, eps, scale, out);
#else
  LOOM_CHECK(false, "l2norm_forward: %s tensor in a build without CUDA", x.describe().c_str());
#endif
}

}  // namespace loom
