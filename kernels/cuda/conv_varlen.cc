// Host side of the varlen CUDA causal conv1d: the checks of kernels/cpu/conv.cc that need no
// values from the device (shapes, dtypes, devices, aliasing), then one launch.
#include "kernels/cuda/conv_varlen.h"

#include <cstdint>

#include "kernels/cuda/device.h"
#include "kernels/cuda/varlen_launch.h"

namespace loom::cuda {
namespace {

// Four elements of `t` at a time: 16 bytes of f32, 8 of bf16.
bool aligned4(const Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.raw()) % (4 * dtype_size(t.dtype())) == 0;
}

bool f32_or_bf16(const Tensor& t) { return t.dtype() == DType::kF32 || t.dtype() == DType::kBF16; }

void varlen(const Exec& ex, const Tensor& x, const Tensor& weight, const Tensor& conv_states,
            const Tensor& state_slots, const Tensor& cu_seqlens, bool apply_silu, const Tensor& out,
            int64_t rows_per_block, bool allow_vec4) {
  const char* fn = "causal_conv1d_varlen";
  LOOM_CHECK_CUDA_ARG(fn, x);
  LOOM_CHECK_CUDA_ARG(fn, weight);
  LOOM_CHECK_CUDA_ARG(fn, conv_states);
  LOOM_CHECK_CUDA_ARG(fn, state_slots);
  LOOM_CHECK_CUDA_ARG(fn, cu_seqlens);
  LOOM_CHECK_CUDA_ARG(fn, out);
  // x, out and the state pool each f32 or bf16 (the weights f32).
  LOOM_CHECK(f32_or_bf16(x) && f32_or_bf16(out) && f32_or_bf16(conv_states),
             "%s: x %s out %s conv_states %s, expected f32 or bf16", fn, x.describe().c_str(),
             out.describe().c_str(), conv_states.describe().c_str());
  LOOM_CHECK_F32(weight);
  LOOM_CHECK(x.ndim() == 2 && weight.ndim() == 2 && conv_states.ndim() == 3,
             "causal_conv1d_varlen: x %s weight %s conv_states %s", x.describe().c_str(),
             weight.describe().c_str(), conv_states.describe().c_str());
  const int64_t N = x.dim(0), C = x.dim(1), W = weight.dim(1);
  LOOM_CHECK(W >= 1, "causal_conv1d_varlen: width %lld", static_cast<long long>(W));
  LOOM_CHECK_SHAPE(weight, C, W);
  LOOM_CHECK_SHAPE(conv_states, conv_states.dim(0), W - 1, C);
  LOOM_CHECK_SHAPE(out, N, C);
  LOOM_CHECK(x.is_contiguous() && weight.is_contiguous() && conv_states.is_contiguous() &&
                 out.is_contiguous(),
             "causal_conv1d_varlen: x, weight, conv_states and out must be contiguous");
  LOOM_CHECK(out.raw() != x.raw() || N * C == 0, "causal_conv1d_varlen: out aliases x");
  LOOM_CHECK(cu_seqlens.dtype() == DType::kI64 && cu_seqlens.ndim() == 1 &&
                 cu_seqlens.dim(0) >= 1 && cu_seqlens.is_contiguous(),
             "%s: cu_seqlens %s, expected contiguous i64 [B + 1]", fn,
             cu_seqlens.describe().c_str());
  const int64_t B = cu_seqlens.dim(0) - 1;
  LOOM_CHECK(state_slots.dtype() == DType::kI32 && state_slots.ndim() == 1 &&
                 state_slots.dim(0) == B && state_slots.is_contiguous(),
             "%s: state_slots %s for %lld sequences", fn, state_slots.describe().c_str(),
             static_cast<long long>(B));
  LOOM_CHECK(B == 0 || N == 0 || conv_states.dim(0) > 0 || W == 1,
             "%s: an empty state pool for %lld sequences", fn, static_cast<long long>(B));
  const bool vec4 =
      allow_vec4 && C % 4 == 0 && aligned4(x) && aligned4(out) && aligned4(conv_states);
  const launch::ConvDtypes dt{.x_bf16 = x.dtype() == DType::kBF16,
                              .out_bf16 = out.dtype() == DType::kBF16,
                              .pool_bf16 = conv_states.dtype() == DType::kBF16};
  launch::causal_conv1d_varlen(stream_of(ex), x.raw(), weight.data<float>(), conv_states.raw(),
                               state_slots.data<int32_t>(), cu_seqlens.data<int64_t>(), out.raw(),
                               N, C, W, B, conv_states.dim(0), apply_silu, dt, vec4,
                               rows_per_block);
}

}  // namespace

void causal_conv1d_varlen(const Exec& ex, const Tensor& x, const Tensor& weight,
                          const Tensor& conv_states, const Tensor& state_slots,
                          const Tensor& cu_seqlens, bool apply_silu, const Tensor& out) {
  varlen(ex, x, weight, conv_states, state_slots, cu_seqlens, apply_silu, out, 0, true);
}

void causal_conv1d_varlen_tuned(const Exec& ex, const Tensor& x, const Tensor& weight,
                                const Tensor& conv_states, const Tensor& state_slots,
                                const Tensor& cu_seqlens, bool apply_silu, const Tensor& out,
                                int64_t rows_per_block, bool allow_vec4) {
  varlen(ex, x, weight, conv_states, state_slots, cu_seqlens, apply_silu, out, rows_per_block,
         allow_vec4);
}

}  // namespace loom::cuda
