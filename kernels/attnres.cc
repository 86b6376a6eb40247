// Device dispatch for kernels/attnres.h.
#include "kernels/attnres.h"

#include "kernels/cpu/attnres.h"

namespace loom {

void attnres_aggregate(const std::vector<Tensor>& sources, const Tensor& query,
                       const Tensor& key_norm, const Tensor& out_norm, float eps,
                       const Tensor& out) {
  LOOM_CHECK(out.device() == Device::kCpu, "attnres_aggregate: no CUDA kernel in this build yet");
  cpu::attnres_aggregate(sources, query, key_norm, out_norm, eps, out);
}

}  // namespace loom
