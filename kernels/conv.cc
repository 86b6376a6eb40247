// Device dispatch for kernels/conv.h.
#include "kernels/conv.h"

#include "kernels/cpu/conv.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/conv.h"
#endif

namespace loom {

void causal_conv1d_forward(const Exec& ex, const Tensor& x, const Tensor& weight,
                           const Tensor& conv_state, bool apply_silu, const Tensor& out) {
  LOOM_ON_EXEC_DEVICE(ex, "causal_conv1d_forward", x, weight, conv_state, out);
  if (ex.device.is_cpu()) return cpu::causal_conv1d_forward(x, weight, conv_state, apply_silu, out);
#ifdef LOOM_WITH_CUDA
  return cuda::causal_conv1d_forward(ex, x, weight, conv_state, apply_silu, out);
#else
  no_kernel_for(ex, "causal_conv1d_forward");
#endif
}

void causal_conv1d_step(const Exec& ex, const Tensor& x, const Tensor& weight,
                        const Tensor& conv_states, bool apply_silu, const Tensor& out) {
  LOOM_ON_EXEC_DEVICE(ex, "causal_conv1d_step", x, weight, conv_states, out);
  if (ex.device.is_cpu()) return cpu::causal_conv1d_step(x, weight, conv_states, apply_silu, out);
#ifdef LOOM_WITH_CUDA
  return cuda::causal_conv1d_step(ex, x, weight, conv_states, apply_silu, out);
#else
  no_kernel_for(ex, "causal_conv1d_step");
#endif
}

void causal_conv1d_varlen(const Exec& ex, const Tensor& x, const Tensor& weight,
                          const Tensor& conv_states, const Tensor& state_slots,
                          const Tensor& cu_seqlens, bool apply_silu, const Tensor& out) {
  LOOM_ON_EXEC_DEVICE(ex, "causal_conv1d_varlen", x, weight, conv_states, state_slots, cu_seqlens,
                      out);
  if (ex.device.is_cpu())
    return cpu::causal_conv1d_varlen(x, weight, conv_states, state_slots, cu_seqlens, apply_silu,
                                     out);
  no_kernel_for(ex, "causal_conv1d_varlen");
}

}  // namespace loom
