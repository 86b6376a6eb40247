// Device dispatch for kernels/norm.h.
#include "kernels/norm.h"

#include <optional>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/norm.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/backward.h"
#include "kernels/cuda/norm.h"
#endif

namespace loom {

namespace {
// x, dout, dx: contiguous f32 of one shape with D >= 1 last.
void check_row_grads(const char* op, const Tensor& x, const Tensor& dout, const Tensor& dx) {
  for (const Tensor* t : {&x, &dout, &dx}) LOOM_CHECK_F32(*t);
  LOOM_CHECK(
      x.ndim() >= 1 && x.dim(-1) >= 1 && dout.shape() == x.shape() && dx.shape() == x.shape(),
      "%s: x %s dout %s dx %s", op, x.describe().c_str(), dout.describe().c_str(),
      dx.describe().c_str());
}
}  // namespace

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

void add_rmsnorm_forward(const Exec& ex, const Tensor& h, const Tensor& delta, const Tensor& w,
                         float eps, float weight_offset, const Tensor& out) {
  LOOM_ON_EXEC_DEVICE(ex, "add_rmsnorm_forward", h, delta, w, out);
  if (ex.device.is_cpu()) {
    cpu::add_inplace(h, delta);
    return cpu::rmsnorm_forward(h, w, eps, weight_offset, out);
  }
#ifdef LOOM_WITH_CUDA
  return cuda::add_rmsnorm_forward(ex, h, delta, w, eps, weight_offset, out);
#else
  no_kernel_for(ex, "add_rmsnorm_forward");
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

void rmsnorm_backward(const Exec& ex, const Tensor& x, const Tensor& w, float eps,
                      float weight_offset, const Tensor& dout, const Tensor& dx, const Tensor& dw) {
  LOOM_ON_EXEC_DEVICE(ex, "rmsnorm_backward", x, w, dout, dx, dw);
  check_row_grads("rmsnorm_backward", x, dout, dx);
  LOOM_CHECK_F32(w);
  LOOM_CHECK_F32(dw);
  LOOM_CHECK(w.numel() == x.dim(-1) && dw.numel() == x.dim(-1), "rmsnorm_backward: x %s w %s dw %s",
             x.describe().c_str(), w.describe().c_str(), dw.describe().c_str());
  if (ex.device.is_cpu()) {
    std::optional<Workspace::Mark> mark;
    if (ex.workspace) mark.emplace(*ex.workspace);
    const Shape rows{x.numel() / x.dim(-1)};
    const Tensor rstd = ex.workspace ? ex.workspace->take(rows) : Tensor::empty(rows);
    return cpu::rmsnorm_backward(x, w, eps, weight_offset, dout, dx, dw, rstd);
  }
#ifdef LOOM_WITH_CUDA
  return cuda::rmsnorm_backward(ex, x, w, eps, weight_offset, dout, dx, dw);
#else
  no_kernel_for(ex, "rmsnorm_backward");
#endif
}

void l2norm_backward(const Exec& ex, const Tensor& x, float eps, float scale, const Tensor& dout,
                     const Tensor& dx) {
  LOOM_ON_EXEC_DEVICE(ex, "l2norm_backward", x, dout, dx);
  check_row_grads("l2norm_backward", x, dout, dx);
  if (ex.device.is_cpu()) return cpu::l2norm_backward(x, eps, scale, dout, dx);
#ifdef LOOM_WITH_CUDA
  return cuda::l2norm_backward(ex, x, eps, scale, dout, dx);
#else
  no_kernel_for(ex, "l2norm_backward");
#endif
}

}  // namespace loom
