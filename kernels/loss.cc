// Device dispatch for kernels/loss.h.
#include "kernels/loss.h"

#include <optional>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/loss.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/loss.h"
#endif

namespace loom {

void cross_entropy_forward_backward(const Exec& ex, const Tensor& hidden, const Tensor& lm_head,
                                    const Tensor& targets, int64_t ignore_index, float loss_scale,
                                    const Tensor& loss, const Tensor& row_loss,
                                    const Tensor& dhidden, const Tensor& dlm_head,
                                    const Tensor& row_weight, const Tensor& host_targets) {
  LOOM_ON_EXEC_DEVICE(ex, "cross_entropy_forward_backward", hidden, lm_head, targets, loss,
                      row_loss, dhidden, dlm_head, row_weight);
  LOOM_CHECK_F32(hidden);
  LOOM_CHECK_F32(lm_head);
  LOOM_CHECK_F32(loss);
  LOOM_CHECK(hidden.ndim() == 2 && lm_head.ndim() == 2 && hidden.dim(1) == lm_head.dim(1) &&
                 lm_head.dim(0) >= 1,
             "cross_entropy_forward_backward: hidden %s lm_head %s", hidden.describe().c_str(),
             lm_head.describe().c_str());
  const int64_t t = hidden.dim(0), d = hidden.dim(1), v = lm_head.dim(0);
  LOOM_CHECK(targets.ndim() == 1 && targets.dim(0) == t && targets.is_contiguous() &&
                 (targets.dtype() == DType::kI32 || targets.dtype() == DType::kI64),
             "cross_entropy_forward_backward: targets must be contiguous i32/i64 [%lld], got %s",
             static_cast<long long>(t), targets.describe().c_str());
  LOOM_CHECK_SHAPE(loss, 1);
  LOOM_CHECK(!host_targets.defined() ||
                 (host_targets.device().is_cpu() && host_targets.dtype() == targets.dtype() &&
                  host_targets.shape() == targets.shape() && host_targets.is_contiguous()),
             "cross_entropy_forward_backward: host_targets must be a contiguous host copy of "
             "targets (%s), got %s",
             targets.describe().c_str(), host_targets.describe().c_str());
  if (row_loss.defined()) {
    LOOM_CHECK_F32(row_loss);
    LOOM_CHECK_SHAPE(row_loss, t);
  }
  if (row_weight.defined()) {
    LOOM_CHECK_F32(row_weight);
    LOOM_CHECK_SHAPE(row_weight, t);
  }
  if (dhidden.defined()) {
    LOOM_CHECK_F32(dhidden);
    LOOM_CHECK_SHAPE(dhidden, t, d);
  }
  if (dlm_head.defined()) {
    LOOM_CHECK_F32(dlm_head);
    LOOM_CHECK_SHAPE(dlm_head, v, d);
  }
  if (ex.device.is_cpu()) {
    const cpu::RowInvariantScope numerics(ex.batch_invariant);
    std::optional<Workspace::Mark> mark;
    if (ex.workspace) mark.emplace(*ex.workspace);
    const cpu::CrossEntropyScratch shapes = cpu::cross_entropy_scratch(t, v, d);
    auto take = [&](Shape s, DType dt) {
      return ex.workspace ? ex.workspace->take(s, dt) : Tensor::empty(s, dt);
    };
    const Tensor scratch = take(shapes.f32, DType::kF32);
    const Tensor rows = take(shapes.rows, DType::kI64);
    return cpu::cross_entropy_forward_backward(hidden, lm_head, targets, ignore_index, loss_scale,
                                               loss, row_loss, dhidden, dlm_head, scratch, rows,
                                               row_weight);
  }
#ifdef LOOM_WITH_CUDA
  return cuda::cross_entropy_forward_backward(ex, hidden, lm_head, targets, ignore_index,
                                              loss_scale, loss, row_loss, dhidden, dlm_head,
                                              row_weight, host_targets);
#else
  no_kernel_for(ex, "cross_entropy_forward_backward");
#endif
}

}  // namespace loom
