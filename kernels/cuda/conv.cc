// Host side of the CUDA causal conv1d (checks as in kernels/cpu/conv.cc).
#include "kernels/cuda/conv.h"

#include "kernels/cuda/device.h"

namespace loom::cuda {

void causal_conv1d_forward(const Exec& ex, const Tensor& x, const Tensor& weight,
                           const Tensor& conv_state, bool apply_silu, const Tensor& out) {
  LOOM_CHECK_CUDA_ARG("causal_conv1d_forward", x);
  LOOM_CHECK_CUDA_ARG("causal_conv1d_forward", weight);
  LOOM_CHECK_CUDA_ARG("causal_conv1d_forward", conv_state);
  LOOM_CHECK_CUDA_ARG("causal_conv1d_forward", out);
  LOOM_CHECK_F32(x);
  LOOM_CHECK_F32(weight);
  LOOM_CHECK_F32(conv_state);
  LOOM_CHECK_F32(out);
  LOOM_CHECK(x.ndim() == 2 && weight.ndim() == 2, "causal_conv1d_forward: x %s weight %s",
             x.describe().c_str(), weight.describe().c_str());
  const int64_t T = x.dim(0), C = x.dim(1), W = weight.dim(1);
  LOOM_CHECK(W >= 1, "causal_conv1d_forward: width %lld", static_cast<long long>(W));
  LOOM_CHECK_SHAPE(weight, C, W);
  LOOM_CHECK_SHAPE(conv_state, W - 1, C);
  LOOM_CHECK_SHAPE(out, T, C);
  LOOM_CHECK(out.raw() != x.raw() || T * C == 0, "causal_conv1d_forward: out aliases x");
  launch::causal_conv1d_forward(stream_of(ex), x.data<float>(), weight.data<float>(),
                                conv_state.data<float>(), out.data<float>(), T, C, W, apply_silu);
}

void causal_conv1d_step(const Exec& ex, const Tensor& x, const Tensor& weight,
                        const Tensor& conv_states, bool apply_silu, const Tensor& out) {
  LOOM_CHECK_CUDA_ARG("causal_conv1d_step", x);
  LOOM_CHECK_CUDA_ARG("causal_conv1d_step", weight);
  LOOM_CHECK_CUDA_ARG("causal_conv1d_step", conv_states);
  LOOM_CHECK_CUDA_ARG("causal_conv1d_step", out);
  LOOM_CHECK_F32(x);
  LOOM_CHECK_F32(weight);
  LOOM_CHECK_F32(conv_states);
  LOOM_CHECK_F32(out);
  LOOM_CHECK(x.ndim() == 2 && weight.ndim() == 2, "causal_conv1d_step: x %s weight %s",
             x.describe().c_str(), weight.describe().c_str());
  const int64_t B = x.dim(0), C = x.dim(1), W = weight.dim(1);
  LOOM_CHECK(W >= 1, "causal_conv1d_step: width %lld", static_cast<long long>(W));
  LOOM_CHECK_SHAPE(weight, C, W);
  LOOM_CHECK_SHAPE(conv_states, B, W - 1, C);
  LOOM_CHECK_SHAPE(out, B, C);
  LOOM_CHECK(out.raw() != x.raw() || B * C == 0, "causal_conv1d_step: out aliases x");
  launch::causal_conv1d_step(stream_of(ex), x.data<float>(), weight.data<float>(),
                             conv_states.data<float>(), out.data<float>(), B, C, W, apply_silu);
}

}  // namespace loom::cuda
