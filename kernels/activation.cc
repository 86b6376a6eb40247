// Device dispatch for kernels/activation.h. CPU only in this build: no CUDA kernel yet.
#include "kernels/activation.h"

#include "kernels/cpu/activation.h"

namespace loom {

void silu_mul_forward(const Tensor& gate, const Tensor& up, const Tensor& out) {
  if (gate.device() == Device::kCpu) return cpu::silu_mul_forward(gate, up, out);
  LOOM_CHECK(false, "silu_mul_forward: no CUDA kernel in this build yet (%s)",
             gate.describe().c_str());
}

void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out) {
  if (table.device() == Device::kCpu) return cpu::embedding_forward(ids, table, out);
  LOOM_CHECK(false, "embedding_forward: no CUDA kernel in this build yet (%s)",
             table.describe().c_str());
}

}  // namespace loom
