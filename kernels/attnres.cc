// Device dispatch for kernels/attnres.h.
#include "kernels/attnres.h"

#include "kernels/cpu/attnres.h"

namespace loom {

void attnres_aggregate(const Exec& ex, const Tensor& sources, const Tensor& query,
                       const Tensor& key_norm, const Tensor& out_norm, float eps,
                       const Tensor& out) {
  LOOM_ON_EXEC_DEVICE(ex, "attnres_aggregate", sources, query, key_norm, out_norm, out);
  for (const Tensor* t : {&sources, &query, &key_norm, &out_norm, &out}) LOOM_CHECK_F32(*t);
  LOOM_CHECK(sources.ndim() == 3 && sources.dim(0) >= 1 && sources.is_contiguous(),
             "attnres_aggregate: sources must be contiguous [S >= 1, N, D], got %s",
             sources.describe().c_str());
  LOOM_CHECK(out.ndim() == 2 && out.is_contiguous() && out.dim(0) == sources.dim(1) &&
                 out.dim(1) == sources.dim(2),
             "attnres_aggregate: out %s for sources %s", out.describe().c_str(),
             sources.describe().c_str());
  for (const Tensor* t : {&query, &key_norm, &out_norm})
    LOOM_CHECK(t->numel() == out.dim(1), "attnres_aggregate: weight %s for D = %lld",
               t->describe().c_str(), static_cast<long long>(out.dim(1)));
  if (ex.device.is_cpu())
    return cpu::attnres_aggregate(sources, query, key_norm, out_norm, eps, out);
  no_kernel_for(ex, "attnres_aggregate");
}

}  // namespace loom
