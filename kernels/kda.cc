// Device dispatch for kernels/kda.h.
#include "kernels/kda.h"

#include "kernels/cpu/kda.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/kda.h"
#endif

namespace loom {

void kda_recurrent_forward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                           const Tensor& g, const Tensor& beta, float scale, const Tensor& state,
                           const Tensor& out) {
  LOOM_ON_EXEC_DEVICE(ex, "kda_recurrent_forward", q, k, v, g, beta, state, out);
  if (ex.device.is_cpu()) return cpu::kda_recurrent_forward(q, k, v, g, beta, scale, state, out);
#ifdef LOOM_WITH_CUDA
  return cuda::kda_recurrent_forward(ex, q, k, v, g, beta, scale, state, out);
#else
  no_kernel_for(ex, "kda_recurrent_forward");
#endif
}

void kda_chunked_forward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& g, const Tensor& beta, float scale, const Tensor& state,
                         const Tensor& out) {
  LOOM_ON_EXEC_DEVICE(ex, "kda_chunked_forward", q, k, v, g, beta, state, out);
  if (ex.device.is_cpu()) return cpu::kda_chunked_forward(q, k, v, g, beta, scale, state, out);
  no_kernel_for(ex, "kda_chunked_forward");
}

void kda_varlen_forward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& g, const Tensor& beta, float scale, const Tensor& states,
                        const Tensor& state_slots, const Tensor& cu_seqlens, const Tensor& out) {
  LOOM_ON_EXEC_DEVICE(ex, "kda_varlen_forward", q, k, v, g, beta, out);
  LOOM_ON_EXEC_DEVICE(ex, "kda_varlen_forward", states, state_slots, cu_seqlens);
  if (ex.device.is_cpu())
    return cpu::kda_varlen_forward(q, k, v, g, beta, scale, states, state_slots, cu_seqlens,
                                   ex.batch_invariant, out);
  no_kernel_for(ex, "kda_varlen_forward");
}

void kda_gate_forward(const Exec& ex, const Tensor& f, const Tensor& A_log, const Tensor& dt_bias,
                      float lower_bound, const Tensor& g) {
  LOOM_ON_EXEC_DEVICE(ex, "kda_gate_forward", f, A_log, dt_bias, g);
  if (ex.device.is_cpu()) return cpu::kda_gate_forward(f, A_log, dt_bias, lower_bound, g);
#ifdef LOOM_WITH_CUDA
  return cuda::kda_gate_forward(ex, f, A_log, dt_bias, lower_bound, g);
#else
  no_kernel_for(ex, "kda_gate_forward");
#endif
}

}  // namespace loom
