// Host side of the CUDA norms: argument checks (as the CPU kernels make them), then the launch.
#include "kernels/cuda/norm.h"

#include "kernels/cuda/device.h"

namespace loom::cuda {

void rmsnorm_forward(const Exec& ex, const Tensor& x, const Tensor& w, float eps,
                     float weight_offset, const Tensor& out) {
  LOOM_CHECK_CUDA_ARG("rmsnorm_forward", x);
  LOOM_CHECK_CUDA_ARG("rmsnorm_forward", w);
  LOOM_CHECK_CUDA_ARG("rmsnorm_forward", out);
  LOOM_CHECK_F32(x);
  LOOM_CHECK_F32(w);
  LOOM_CHECK_F32(out);
  const int64_t d = x.dim(-1);
  LOOM_CHECK(w.numel() == d && out.shape() == x.shape(), "rmsnorm: x %s w %s out %s",
             x.describe().c_str(), w.describe().c_str(), out.describe().c_str());
  launch::rmsnorm(stream_of(ex), x.data<float>(), w.data<float>(), out.data<float>(),
                  d ? x.numel() / d : 0, d, eps, weight_offset);
}

void l2norm_forward(const Exec& ex, const Tensor& x, float eps, float scale, const Tensor& out) {
  LOOM_CHECK_CUDA_ARG("l2norm_forward", x);
  LOOM_CHECK_CUDA_ARG("l2norm_forward", out);
  LOOM_CHECK_F32(x);
  LOOM_CHECK_F32(out);
  LOOM_CHECK(out.shape() == x.shape(), "l2norm: x %s out %s", x.describe().c_str(),
             out.describe().c_str());
  const int64_t d = x.dim(-1);
  launch::l2norm(stream_of(ex), x.data<float>(), out.data<float>(), d ? x.numel() / d : 0, d, eps,
                 scale);
}

}  // namespace loom::cuda
