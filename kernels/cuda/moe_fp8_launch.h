// The grouped SwiGLU with stored FP8 expert weights (kernels/cuda/moe_fp8.cu): what
// launch::moe_swiglu_plan and launch::moe_grouped_swiglu (kernels/cuda/moe_launch.h) run when
// MoeSwigluArgs::fp8 is set. Same contracts as those two; includes no Loom or Abseil header.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

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

// kAuto takes the block-scaled FP8 wgmma path (kWgmmaFp8: x and h quantized per row and 128
// columns, W8A8) outside batch-invariant mode from this many rows per expert on average, where
// each expert's rows fill at least one 128-row tile. Below it, past the GEMV, the experts'
// dequantized copies run on the bf16 tensor cores (W8A16, the numbers the FP8 fixture's model
// bounds assume: DeepSeek-V3's activation quantization moves that untrained model's logits by 0.39
// to 0.52 relative L2, ../shared/fixtures/README.md). It is a fidelity choice, not a speed one: on
// the H200 at the 48B shape kWgmmaFp8 is faster than the copies at every size measured (0.80
// against 3.64 ms at 8 rows per expert, 1.18 against 4.20 at 128) and than the GEMV from 2 rows
// per expert (0.93 against 1.98 ms at 64 tokens, its first version); bench/results/gpu-h200.md.
inline constexpr int64_t kMoeFp8BlockRowsPerExpert = 128;

// One grouped GEMM of the kWgmmaFp8 path (kernels/cuda/moe_fp8_wgmma.cu; the SwiGLU runs the dual
// one, then the single one; tests run each alone). For every expert e and row r in
// [offsets[e], offsets[e + 1]) (clamped to [0, R]) and column n < N:
//   acc[r, n] = sum_kb a_scales[kb * R + r] * s[e, n / 128, kb] * sum_{k in kb} f32(a[r, k])
//   f32(b[e, n, k])
// over the 128-column blocks kb of K (the inner sums on the FP8 tensor cores, the outer one f32).
// Single (b1 null): out[r, n] = acc (f32, or rounded to bf16). Dual (b0 = W_gate, b1 = W_up):
// g and u, h = silu(g) * u quantized per row and 128 columns as quantize_fp8_groups does (scale
// amax / 448; the quotient as h * (448 / amax), within an f32 ulp of h / scale, or h / scale
// where 448 / amax overflows) into h_q and h_scales (the next GEMM's a and a_scales), g and u
// into gate_up when not null.
// Rows of no expert are never written.
struct MoeFp8BlockGemm {
  const uint8_t* a = nullptr;        // [R, K] e4m3
  const float* a_scales = nullptr;   // [ceil(K / 128), R] (quantize_fp8_groups's layout)
  const int32_t* offsets = nullptr;  // [E + 1], device
  const uint8_t* b0 = nullptr;       // [E, N, K] e4m3
  const float* s0 = nullptr;         // [E, ceil(N / 128), ceil(K / 128)]
  const uint8_t* b1 = nullptr;       // dual: W_up [E, N, K]; null: single
  const float* s1 = nullptr;
  int64_t R = 0, E = 0, N = 0, K = 0;
  void* out = nullptr;  // single: [R, N] f32 or bf16 (out_bf16)
  bool out_bf16 = false;
  uint8_t* h_q = nullptr;     // dual: [R, N] e4m3
  float* h_scales = nullptr;  // dual: [ceil(N / 128), R]
  float* gate_up = nullptr;   // dual: [2, R, N] f32 or null
};
// An sm_90 device, K > 0 and N multiples of 16, 16-byte aligned tensors.
bool moe_fp8_block_gemm_supported(const MoeFp8BlockGemm& g);
void moe_fp8_block_gemm(cudaStream_t stream, const MoeFp8BlockGemm& g);

MoeSwigluPlan moe_fp8_swiglu_plan(const MoeSwigluArgs& a, MoeGemmPath path);
void moe_fp8_grouped_swiglu(cudaStream_t stream, const MoeSwigluArgs& a, const MoeSwigluPlan& plan,
                            void* scratch);

}  // namespace loom::cuda::launch
