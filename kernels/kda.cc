// Device dispatch for kernels/kda.h.
#include "kernels/kda.h"

#include "kernels/cpu/kda.h"

namespace loom {

// No CUDA KDA kernels exist yet: non-CPU tensors fail loudly in every build.
void kda_recurrent_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                           const Tensor& beta, float scale, const Tensor& state,
                           const Tensor& out) {
  if (q.device() == Device::kCpu)
    return cpu::kda_recurrent_forward(q, k, v, g, beta, scale, state, out);
  LOOM_CHECK(false, "kda_recurrent_forward: no CUDA kernel in this build yet (%s)",
             q.describe().c_str());
}

void kda_chunked_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                         const Tensor& beta, float scale, const Tensor& state, const Tensor& out) {
  if (q.device() == Device::kCpu)
    return cpu::kda_chunked_forward(q, k, v, g, beta, scale, state, out);
  LOOM_CHECK(false, "kda_chunked_forward: no CUDA kernel in this build yet (%s)",
             q.describe().c_str());
}

void kda_gate_forward(const Tensor& f, const Tensor& A_log, const Tensor& dt_bias,
                      float lower_bound, const Tensor& g) {
  if (f.device() == Device::kCpu) return cpu::kda_gate_forward(f, A_log, dt_bias, lower_bound, g);
  LOOM_CHECK(false, "kda_gate_forward: no CUDA kernel in this build yet (%s)",
             f.describe().c_str());
}

}  // namespace loom
