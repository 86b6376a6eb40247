// Device dispatch for kernels/kda.h.
#include "kernels/kda.h"

#include "kernels/cpu/kda.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/kda.h"
#endif

namespace loom {

// No CUDA KDA kernels exist yet: non-CPU tensors fail loudly in every build.
void kda_recurrent_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                           const Tensor& beta, float scale, const Tensor& state,
                           const Tensor& out) {
#ifdef LOOM_WITH_CUDA
  LOOM_CHECK_SAME_DEVICE("kda_recurrent_forward", q, k, v, g, beta, state, out);
#endif
  if (q.device() == Device::kCpu)
    return cpu::kda_recurrent_forward(q, k, v, g, beta, scale, state, out);
#ifdef LOOM_WITH_CUDA
  return cuda::kda_recurrent_forward(q, k, v, g, beta, scale, state, out);
#else
  LOOM_CHECK(false, "kda_recurrent_forward: %s tensor in a build without CUDA",
             q.describe().c_str());
#endif
}

void kda_chunked_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                         const Tensor& beta, float scale, const Tensor& state, const Tensor& out) {
#ifdef LOOM_WITH_CUDA
  LOOM_CHECK_SAME_DEVICE("kda_chunked_forward", q, k, v, g, beta, state, out);
#endif
  if (q.device() == Device::kCpu)
    return cpu::kda_chunked_forward(q, k, v, g, beta, scale, state, out);
  LOOM_CHECK(false, "kda_chunked_forward: no CUDA kernel yet (%s); use kda_recurrent_forward",
             q.describe().c_str());
}

void kda_gate_forward(const Tensor& f, const Tensor& A_log, const Tensor& dt_bias,
                      float lower_bound, const Tensor& g) {
#ifdef LOOM_WITH_CUDA
  LOOM_CHECK_SAME_DEVICE("kda_gate_forward", f, A_log, dt_bias, g);
#endif
  if (f.device() == Device::kCpu) return cpu::kda_gate_forward(f, A_log, dt_bias, lower_bound, g);
#ifdef LOOM_WITH_CUDA
  return cuda::kda_gate_forward(f, A_log, dt_bias, lower_bound, g);
#else
  LOOM_CHECK(false, "kda_gate_forward: %s tensor in a build without CUDA", f.describe().c_str());
#endif
}

}  // namespace loom
