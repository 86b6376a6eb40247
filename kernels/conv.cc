// Device dispatch for kernels/conv.h.
#include "kernels/conv.h"

#include "kernels/cpu/conv.h"

namespace loom {

// No CUDA convolution kernels exist yet: non-CPU tensors fail loudly in every build.
void causal_conv1d_forward(const Tensor& x, const Tensor& weight, const Tensor& conv_state,
                           bool apply_silu, const Tensor& out) {
  if (x.device() == Device::kCpu)
    return cpu::causal_conv1d_forward(x, weight, conv_state, apply_silu, out);
  LOOM_CHECK(false, "causal_conv1d_forward: no CUDA kernel in this build yet (%s)",
             x.describe().c_str());
}

void causal_conv1d_step(const Tensor& x, const Tensor& weight, const Tensor& conv_states,
                        bool apply_silu, const Tensor& out) {
  if (x.device() == Device::kCpu)
    return cpu::causal_conv1d_step(x, weight, conv_states, apply_silu, out);
  LOOM_CHECK(false, "causal_conv1d_step: no CUDA kernel in this build yet (%s)",
             x.describe().c_str());
}

}  // namespace loom
