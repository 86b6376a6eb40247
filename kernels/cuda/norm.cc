// Host side of the CUDA norms: argument checks (as the CPU kernels make them, with bf16 allowed
// for x and out), then the launch.
#include "kernels/cuda/norm.h"

#include "kernels/cuda/device.h"

namespace loom::cuda {

void rmsnorm_forward(const Exec& ex, const Tensor& x, const Tensor& w, float eps,
                     float weight_offset, const Tensor& out) {
  LOOM_CHECK_CUDA_ARG("rmsnorm_forward", x);
  LOOM_CHECK_CUDA_ARG("rmsnorm_forward", w);
  LOOM_CHECK_CUDA_ARG("rmsnorm_forward", out);
  LOOM_CHECK_ACT(x);
  LOOM_CHECK_F32(w);
  LOOM_CHECK_ACT(out);
  const int64_t d = x.dim(-1);
  LOOM_CHECK(w.numel() == d && out.shape() == x.shape(), "rmsnorm: x %s w %s out %s",
             x.describe().c_str(), w.describe().c_str(), out.describe().c_str());
  LOOM_CHECK_ALIAS_SAME_TYPE("rmsnorm_forward", out, x);
  launch::rmsnorm(stream_of(ex), x.raw(), x.dtype() == DType::kBF16, w.data<float>(), out.raw(),
                  out.dtype() == DType::kBF16, d ? x.numel() / d : 0, d, eps, weight_offset);
}

void add_rmsnorm_forward(const Exec& ex, const Tensor& h, const Tensor& delta, const Tensor& w,
                         float eps, float weight_offset, const Tensor& out) {
  LOOM_CHECK_CUDA_ARG("add_rmsnorm_forward", h);
  LOOM_CHECK_CUDA_ARG("add_rmsnorm_forward", delta);
  LOOM_CHECK_CUDA_ARG("add_rmsnorm_forward", w);
  LOOM_CHECK_CUDA_ARG("add_rmsnorm_forward", out);
  LOOM_CHECK_ACT(h);
  LOOM_CHECK_ACT(delta);
  LOOM_CHECK_F32(w);
  LOOM_CHECK_ACT(out);
  const int64_t d = h.dim(-1);
  LOOM_CHECK(w.numel() == d && out.shape() == h.shape() && delta.shape() == h.shape(),
             "add_rmsnorm: h %s delta %s w %s out %s", h.describe().c_str(),
             delta.describe().c_str(), w.describe().c_str(), out.describe().c_str());
  LOOM_CHECK_ALIAS_SAME_TYPE("add_rmsnorm_forward", out, h);
  LOOM_CHECK(!overlaps(delta, h) && !overlaps(delta, out),
             "add_rmsnorm_forward: delta %s overlaps h %s or out %s", delta.describe().c_str(),
             h.describe().c_str(), out.describe().c_str());
  launch::add_rmsnorm(stream_of(ex), h.raw(), h.dtype() == DType::kBF16, delta.raw(),
                      delta.dtype() == DType::kBF16, w.data<float>(), out.raw(),
                      out.dtype() == DType::kBF16, d ? h.numel() / d : 0, d, eps, weight_offset);
}

void l2norm_forward(const Exec& ex, const Tensor& x, float eps, float scale, const Tensor& out) {
  LOOM_CHECK_CUDA_ARG("l2norm_forward", x);
  LOOM_CHECK_CUDA_ARG("l2norm_forward", out);
  LOOM_CHECK_ACT(x);
  LOOM_CHECK_ACT(out);
  LOOM_CHECK(out.shape() == x.shape(), "l2norm: x %s out %s", x.describe().c_str(),
             out.describe().c_str());
  LOOM_CHECK_ALIAS_SAME_TYPE("l2norm_forward", out, x);
  const int64_t d = x.dim(-1);
  launch::l2norm(stream_of(ex), x.raw(), x.dtype() == DType::kBF16, out.raw(),
                 out.dtype() == DType::kBF16, d ? x.numel() / d : 0, d, eps, scale);
}

}  // namespace loom::cuda
