// Device dispatch for kernels/conv.h.
#include "kernels/conv.h"

#include "kernels/cpu/conv.h"
#include "kernels/cpu/varlen.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/backward.h"
#include "kernels/cuda/conv.h"
#include "kernels/cuda/conv_varlen.h"
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

void causal_conv1d_backward(const Exec& ex, const Tensor& x, const Tensor& weight,
                            const Tensor& initial_state, bool apply_silu, const Tensor& dout,
                            const Tensor& dfinal_state, const Tensor& dx, const Tensor& dweight,
                            const Tensor& dinitial_state) {
  LOOM_ON_EXEC_DEVICE(ex, "causal_conv1d_backward", x, weight, initial_state, dout, dfinal_state,
                      dx, dweight, dinitial_state);
  for (const Tensor* t : {&x, &weight, &dout, &dx, &dweight}) LOOM_CHECK_F32(*t);
  LOOM_CHECK(x.ndim() == 2 && weight.ndim() == 2 && weight.dim(1) >= 1,
             "causal_conv1d_backward: x %s weight %s", x.describe().c_str(),
             weight.describe().c_str());
  const int64_t T = x.dim(0), C = x.dim(1), W = weight.dim(1);
  LOOM_CHECK_SHAPE(weight, C, W);
  LOOM_CHECK_SHAPE(dweight, C, W);
  LOOM_CHECK_SHAPE(dout, T, C);
  LOOM_CHECK_SHAPE(dx, T, C);
  for (const Tensor* t : {&initial_state, &dfinal_state, &dinitial_state}) {
    if (!t->defined()) continue;
    LOOM_CHECK_F32(*t);
    LOOM_CHECK(t->shape() == Shape({W - 1, C}), "causal_conv1d_backward: state %s for [%lld, %lld]",
               t->describe().c_str(), static_cast<long long>(W - 1), static_cast<long long>(C));
  }
  LOOM_CHECK(dx.raw() != x.raw() || T * C == 0, "causal_conv1d_backward: dx aliases x");
  if (ex.device.is_cpu())
    return cpu::causal_conv1d_backward(x, weight, initial_state, apply_silu, dout, dfinal_state, dx,
                                       dweight, dinitial_state);
#ifdef LOOM_WITH_CUDA
  return cuda::causal_conv1d_backward(ex, x, weight, initial_state, apply_silu, dout, dfinal_state,
                                      dx, dweight, dinitial_state);
#else
  no_kernel_for(ex, "causal_conv1d_backward");
#endif
}

void causal_conv1d_varlen_backward(const Exec& ex, const Tensor& x, const Tensor& weight,
                                   const Tensor& cu_seqlens, bool apply_silu, const Tensor& dout,
                                   const Tensor& dx, const Tensor& dweight) {
  static constexpr const char* kOp = "causal_conv1d_varlen_backward";
  LOOM_ON_EXEC_DEVICE(ex, kOp, x, weight, cu_seqlens, dout, dx, dweight);
  for (const Tensor* t : {&x, &weight, &dout, &dx, &dweight}) LOOM_CHECK_F32(*t);
  LOOM_CHECK(x.ndim() == 2 && weight.ndim() == 2 && weight.dim(1) >= 1, "%s: x %s weight %s", kOp,
             x.describe().c_str(), weight.describe().c_str());
  const int64_t T = x.dim(0), C = x.dim(1), W = weight.dim(1);
  LOOM_CHECK_SHAPE(weight, C, W);
  LOOM_CHECK_SHAPE(dweight, C, W);
  LOOM_CHECK_SHAPE(dout, T, C);
  LOOM_CHECK_SHAPE(dx, T, C);
  LOOM_CHECK(dx.raw() != x.raw() || T * C == 0, "%s: dx aliases x", kOp);
  if (!ex.device.is_cpu()) {
#ifdef LOOM_WITH_CUDA
    return cuda::causal_conv1d_varlen_backward(ex, x, weight, cu_seqlens, apply_silu, dout, dx,
                                               dweight);
#else
    no_kernel_for(ex, kOp);
#endif
  }
  const int64_t b = cpu::check_cu_seqlens(kOp, cu_seqlens, T);
  const int64_t* cu = cu_seqlens.data<int64_t>();
  for (int64_t s = 0; s < b; ++s) {
    cpu::causal_conv1d_backward(x.slice(0, cu[s], cu[s + 1]), weight, Tensor(), apply_silu,
                                dout.slice(0, cu[s], cu[s + 1]), Tensor(),
                                dx.slice(0, cu[s], cu[s + 1]), dweight, Tensor());
  }
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
  if (ex.device.is_cpu()) {
    LOOM_CHECK(x.dtype() == DType::kF32 && out.dtype() == DType::kF32 &&
                   conv_states.dtype() == DType::kF32,
               "causal_conv1d_varlen: x %s out %s conv_states %s: the CPU kernel takes f32 (bf16 "
               "runs on CUDA)",
               x.describe().c_str(), out.describe().c_str(), conv_states.describe().c_str());
    return cpu::causal_conv1d_varlen(x, weight, conv_states, state_slots, cu_seqlens, apply_silu,
                                     out);
  }
#ifdef LOOM_WITH_CUDA
  return cuda::causal_conv1d_varlen(ex, x, weight, conv_states, state_slots, cu_seqlens, apply_silu,
                                    out);
#else
  no_kernel_for(ex, "causal_conv1d_varlen");
#endif
}

}  // namespace loom
