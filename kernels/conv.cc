// Device dispatch for kernels/conv.h.
#include "kernels/conv.h"

#include "kernels/cpu/conv.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/conv.h"
#endif

namespace loom {

// No CUDA convolution kernels exist yet: non-CPU tensors fail loudly in every build.
void causal_conv1d_forward(const Tensor& x, const Tensor& weight, const Tensor& conv_state,
                           bool apply_silu, const Tensor& out) {
#ifdef LOOM_WITH_CUDA
  LOOM_CHECK_SAME_DEVICE("causal_conv1d_forward", x, weight, conv_state, out);
#endif
  if (x.device() == Device::kCpu)
    return cpu::causal_conv1d_forward(x, weight, conv_state, apply_silu, out);
#ifdef LOOM_WITH_CUDA
  return cuda::causal_conv1d_forward(x, weight, conv_state, apply_silu, out);
#else
  LOOM_CHECK(false, "causal_conv1d_forward: %s tensor in a build without CUDA",
             x.describe().c_str());
#endif
}

void causal_conv1d_step(const Tensor& x, const Tensor& weight, const Tensor& conv_states,
                        bool apply_silu, const Tensor& out) {
#ifdef LOOM_WITH_CUDA
  LOOM_CHECK_SAME_DEVICE("causal_conv1d_step", x, weight, conv_states, out);
#endif
  if (x.device() == Device::kCpu)
    return cpu::causal_conv1d_step(x, weight, conv_states, apply_silu, out);
#ifdef LOOM_WITH_CUDA
  return cuda::causal_conv1d_step(x, weight, conv_states, apply_silu, out);
#else
  LOOM_CHECK(false, "causal_conv1d_step: %s tensor in a build without CUDA", x.describe().c_str());
#endif
}

}  // namespace loom
