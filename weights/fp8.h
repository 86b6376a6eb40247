// Block-quantized FP8 weights (DeepSeek-V3's checkpoint format) to f32.
#pragma once

#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace loom {

// w[r, c] = f32(q[r, c]) * scale_inv[r / block_rows, c / block_cols], each an f32 product (the
// scale is never rounded first). q: [rows, cols] f8e4m3 or f8e5m2; scale_inv: f32 (or bf16/f16)
// [ceil(rows / block_rows), ceil(cols / block_cols)]: the last block of a dimension that is not a
// multiple of the block size is partial (DeepSeek-V3's kv_a_proj_with_mqa is [576, 7168] with [5,
// 56] scales). InvalidArgument naming `name` for another rank, dtype or scale grid.
absl::StatusOr<Tensor> dequantize_fp8_blocks(const Tensor& q, const Tensor& scale_inv,
                                             int block_rows, int block_cols, std::string_view name);

}  // namespace loom
