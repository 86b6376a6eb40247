// The grouped SwiGLU with stored FP8 expert weights (kernels/cuda/moe_fp8.cu): what
// launch::moe_swiglu_plan and launch::moe_grouped_swiglu (kernels/cuda/moe_launch.h) run when
// MoeSwigluArgs::fp8 is set. Same contracts as those two; includes no Loom or Abseil header.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "kernels/cuda/moe_launch.h"

namespace loom::cuda::launch {

// Scratch the dequantized copies of a chunk of experts take at most (one expert when a single
// expert is larger): the chunk's experts run through the bf16 (or f32) paths, one chunk after
// another, so this bounds what an FP8 layer adds to the workspace whatever its expert count.
inline constexpr size_t kMoeFp8DequantBytes = size_t{256} << 20;

// kAuto takes the FP8 GEMV (outside batch-invariant mode) up to this many rows per expert on
// average, or kMoeGemvAutoRows rows in all if that is more: the GEMV reads an expert's weights
// once per two of its rows, the copies cost about five reads of them (read e4m3, write bf16, read
// bf16) before the tensor cores start.
inline constexpr int64_t kMoeFp8GemvRowsPerExpert = 4;

MoeSwigluPlan moe_fp8_swiglu_plan(const MoeSwigluArgs& a, MoeGemmPath path);
void moe_fp8_grouped_swiglu(cudaStream_t stream, const MoeSwigluArgs& a, const MoeSwigluPlan& plan,
                            void* scratch);

}  // namespace loom::cuda::launch
