// Device dispatch for kernels/attnres.h.
#include "kernels/attnres.h"

#include <optional>

#include "kernels/cpu/attnres.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/attnres.h"
#include "kernels/cuda/backward.h"
#endif

namespace loom {

namespace {
// The forward's contract: sources [S >= 1, N, D], rows [N, D] (out or dout), weights [D]; the
// dtype of rows is the caller's to check.
void check_attnres(const char* op, const Tensor& sources, const Tensor& rows,
                   std::initializer_list<const Tensor*> weights) {
  LOOM_CHECK_F32(sources);
  LOOM_CHECK(sources.ndim() == 3 && sources.dim(0) >= 1,
             "%s: sources must be contiguous [S >= 1, N, D], got %s", op,
             sources.describe().c_str());
  LOOM_CHECK(rows.ndim() == 2 && rows.dim(0) == sources.dim(1) && rows.dim(1) == sources.dim(2),
             "%s: %s for sources %s", op, rows.describe().c_str(), sources.describe().c_str());
  for (const Tensor* t : weights) {
    LOOM_CHECK_F32(*t);
    LOOM_CHECK(t->numel() == rows.dim(1), "%s: weight %s for D = %lld", op, t->describe().c_str(),
               static_cast<long long>(rows.dim(1)));
  }
}
}  // namespace

void attnres_aggregate(const Exec& ex, const Tensor& sources, const Tensor& query,
                       const Tensor& key_norm, const Tensor& out_norm, float eps,
                       const Tensor& out) {
  LOOM_ON_EXEC_DEVICE(ex, "attnres_aggregate", sources, query, key_norm, out_norm, out);
  check_attnres("attnres_aggregate", sources, out, {&query, &key_norm, &out_norm});
  if (ex.device.is_cpu()) {
    LOOM_CHECK(out.dtype() == DType::kF32 && out.is_contiguous(),
               "attnres_aggregate: out %s: the CPU kernel writes contiguous f32 (a bf16 out runs "
               "on CUDA)",
               out.describe().c_str());
    return cpu::attnres_aggregate(sources, query, key_norm, out_norm, eps, out);
  }
#ifdef LOOM_WITH_CUDA
  return cuda::attnres_aggregate(ex, sources, query, key_norm, out_norm, eps, out);
#else
  no_kernel_for(ex, "attnres_aggregate");
#endif
}

void attnres_aggregate_backward(const Exec& ex, const Tensor& sources, const Tensor& query,
                                const Tensor& key_norm, const Tensor& out_norm, float eps,
                                const Tensor& dout, const Tensor& dsources, const Tensor& dquery,
                                const Tensor& dkey_norm, const Tensor& dout_norm) {
  LOOM_ON_EXEC_DEVICE(ex, "attnres_aggregate_backward", sources, query, key_norm, out_norm, dout,
                      dsources, dquery, dkey_norm);
  LOOM_ON_EXEC_DEVICE(ex, "attnres_aggregate_backward", dout_norm);
  check_attnres("attnres_aggregate_backward", sources, dout,
                {&query, &key_norm, &out_norm, &dquery, &dkey_norm, &dout_norm});
  LOOM_CHECK_F32(dout);  // the backward is f32 only
  LOOM_CHECK_F32(dsources);
  LOOM_CHECK(dsources.shape() == sources.shape(), "attnres_aggregate_backward: dsources %s for %s",
             dsources.describe().c_str(), sources.describe().c_str());
  if (ex.device.is_cpu()) {
    std::optional<Workspace::Mark> mark;
    if (ex.workspace) mark.emplace(*ex.workspace);
    const Shape shape =
        cpu::attnres_backward_scratch(sources.dim(0), sources.dim(1), sources.dim(2));
    const Tensor scratch = ex.workspace ? ex.workspace->take(shape) : Tensor::empty(shape);
    return cpu::attnres_aggregate_backward(sources, query, key_norm, out_norm, eps, dout, dsources,
                                           dquery, dkey_norm, dout_norm, scratch);
  }
#ifdef LOOM_WITH_CUDA
  return cuda::attnres_aggregate_backward(ex, sources, query, key_norm, out_norm, eps, dout,
                                          dsources, dquery, dkey_norm, dout_norm);
#else
  no_kernel_for(ex, "attnres_aggregate_backward");
#endif
}

}  // namespace loom
