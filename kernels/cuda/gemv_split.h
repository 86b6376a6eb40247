// How many warps split each weight row's k in Loom's GEMVs (gemm_bf16.cu's bf16 GEMV, gemv.cu's
// f32 one): S = 1, 2, 4 or 8, from n and k only, never from the row count, so that a row's bits
// are the same in a 1-row and an 8-row call.
//
// Why split: a decode step's GEMVs are memory-bound, and one warp per row leaves too few warps
// (too few bytes in flight) wherever n is small (bench/results/gpu-h200.md: n = 128 ran at 0.1
// TB/s, an MoE router's n = 256 f32 rows at 0.36 TB/s). Splitting stops once the warps would
// fill the GPU (H200: 132 SMs x 64 warps) or a slice would drop below 256 columns (each lane
// then still loads at least one 16-byte word per pass).
#pragma once

#include <cstdint>

namespace loom::cuda {

inline constexpr int kGemvMaxSplit = 8;

inline int gemv_split(int64_t n, int64_t k) {
  constexpr int64_t kTargetWarps = 8192, kMinSliceCols = 256;
  int s = 1;
  while (s < kGemvMaxSplit && n * s < kTargetWarps && k / (2 * s) >= kMinSliceCols) s *= 2;
  return s;
}

}  // namespace loom::cuda
