// Device dispatch for kernels/activation.h: CPU kernels, and their CUDA twins in builds with CUDA.
#include "kernels/activation.h"

#include "kernels/cpu/activation.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/activation.h"
#endif

namespace loom {

void silu_mul_forward(const Tensor& gate, const Tensor& up, const Tensor& out) {
#ifdef LOOM_WITH_CUDA
  LOOM_CHECK_SAME_DEVICE("silu_mul_forward", gate, up, out);
#endif
  if (gate.device() == Device::kCpu) return cpu::silu_mul_forward(gate, up, out);
#ifdef LOOM_WITH_CUDA
  return cuda::silu_mul_forward(gate, up, out);
#else
  LOOM_CHECK(false, "silu_mul_forward: %s tensor in a build without CUDA", gate.describe().c_str());
#endif
}

void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out) {
#ifdef LOOM_WITH_CUDA
  LOOM_CHECK_SAME_DEVICE("embedding_forward", table, out);
#endif
  if (table.device() == Device::kCpu) return cpu::embedding_forward(ids, table, out);
#ifdef LOOM_WITH_CUDA
  return cuda::embedding_forward(ids, table, out);
#else
  LOOM_CHECK(false, "embedding_forward: %s tensor in a build without CUDA",
             table.describe().c_str());
#endif
}

}  // namespace loom
