// Device dispatch for kernels/activation.h: CPU kernels, and their CUDA twins in builds with CUDA.
#include "kernels/activation.h"

#include "kernels/cpu/activation.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/activation.h"
#endif

namespace loom {

void silu_mul_forward(const Exec& ex, const Tensor& gate, const Tensor& up, const Tensor& out) {
  LOOM_ON_EXEC_DEVICE(ex, "silu_mul_forward", gate, up, out);
  if (ex.device.is_cpu()) return cpu::silu_mul_forward(gate, up, out);
#ifdef LOOM_WITH_CUDA
  return cuda::silu_mul_forward(ex, gate, up, out);
#else
  no_kernel_for(ex, "silu_mul_forward");
#endif
}

void embedding_forward(const Exec& ex, const Tensor& ids, const Tensor& table, const Tensor& out) {
  LOOM_ON_EXEC_DEVICE(ex, "embedding_forward", table, out);
  if (ex.device.is_cpu()) return cpu::embedding_forward(ids, table, out);
#ifdef LOOM_WITH_CUDA
  return cuda::embedding_forward(ex, ids, table, out);
#else
  no_kernel_for(ex, "embedding_forward");
#endif
}

}  // namespace loom
