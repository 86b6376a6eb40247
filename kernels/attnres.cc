// Device dispatch for kernels/attnres.h.
#include "kernels/attnres.h"

#include "kernels/cpu/attnres.h"

namespace loom {

void attnres_aggregate(const Exec& ex, const std::vector<Tensor>& sources, const Tensor& query,
                       const Tensor& key_norm, const Tensor& out_norm, float eps,
                       const Tensor& out) {
  for (const Tensor& s : sources) LOOM_ON_EXEC_DEVICE(ex, "attnres_aggregate", s);
  LOOM_ON_EXEC_DEVICE(ex, "attnres_aggregate", query, key_norm, out_norm, out);
  if (ex.device.is_cpu())
    return cpu::attnres_aggregate(sources, query, key_norm, out_norm, eps, out);
  no_kernel_for(ex, "attnres_aggregate");
}

}  // namespace loom
