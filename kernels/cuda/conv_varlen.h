// CUDA twin of causal_conv1d_varlen (kernels/conv.h): same contract, every tensor argument on the
// GPU and contiguous (state_slots and cu_seqlens too), one kernel launch on the Exec's stream
// without synchronising (kernels/cuda/conv_varlen.cu says how the state update avoids a race).
// x, out and conv_states may each be f32 or bf16 (f32 arithmetic; bf16 outputs and states are
// rounded to nearest even as they are stored, so bf16 x into a bf16 pool keeps its inputs
// exactly); weight is f32.
// The values of cu_seqlens and state_slots stay on the device and are not checked here (the CPU
// twin checks them on the host); a slot outside the pool reads as NaN and is not written.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "kernels/cuda/check.h"
#include "kernels/exec.h"

namespace loom::cuda {

void causal_conv1d_varlen(const Exec& ex, const Tensor& x, const Tensor& weight,
                          const Tensor& conv_states, const Tensor& state_slots,
                          const Tensor& cu_seqlens, bool apply_silu, const Tensor& out);

// The same with the rows per thread forced (0: chosen from the shape) and the four-channel path
// allowed or not, for tests and benchmarks; the result does not depend on either.
void causal_conv1d_varlen_tuned(const Exec& ex, const Tensor& x, const Tensor& weight,
                                const Tensor& conv_states, const Tensor& state_slots,
                                const Tensor& cu_seqlens, bool apply_silu, const Tensor& out,
                                int64_t rows_per_block, bool allow_vec4);

}  // namespace loom::cuda
