// Block-quantized FP8 weights (DeepSeek-V3's checkpoint format): dequantization to f32, and
// quantization of f32 matrices into Loom's stored FP8 matrices (core/fp8_matrix.h).
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace loom {

// w[.., r, c] = f32(q[.., r, c]) * scale_inv[.., r / block_rows, c / block_cols], each an f32
// product (the scale is never rounded first). q: [rows, cols] or a stack [E, rows, cols] (a native
// checkpoint's experts), f8e4m3 or f8e5m2; scale_inv: f32 (or bf16/f16) [E?, ceil(rows /
// block_rows), ceil(cols / block_cols)]: the last block of a dimension that is not a multiple of
// the block size is partial (DeepSeek-V3's kv_a_proj_with_mqa is [576, 7168] with [5, 56]
// scales). InvalidArgument naming `name` for another rank, dtype or scale grid.
absl::StatusOr<Tensor> dequantize_fp8_blocks(const Tensor& q, const Tensor& scale_inv,
                                             int block_rows, int block_cols, std::string_view name);

// The e4m3 encoder (f32_to_f8e4m3) is in core/dtype.h: the KV cache uses it too.

// Quantizes the f32 matrix (or stack of matrices) `w` [.., N, K] into `q`, a stored FP8 matrix of
// the same shape (core/fp8_matrix.h: from the arena or fp8_matrix_empty): per 128 x 128 block
// (partial at the edges), scale_inv = f32(amax / 448), or 1 for an all-zero block (so that
// dequantization gives exact zeros), and q = f32_to_f8e4m3(w / scale_inv) with the quotient exact.
// InvalidArgument naming `name` for a non-finite weight (its block would have no finite scale).
absl::Status quantize_fp8_blocks(const Tensor& w, const Tensor& q, std::string_view name);

}  // namespace loom
