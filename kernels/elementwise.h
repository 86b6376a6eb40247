// Small elementwise and data-movement operations the model needs between the big kernels.
// Contiguous f32 unless noted.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/exec.h"

namespace loom {

// dst += src (same shape).
void add_inplace(const Exec& ex, const Tensor& dst, const Tensor& src);
// x[r, :] += bias for every row r. x: [N, C]; bias: [C].
void add_bias(const Exec& ex, const Tensor& x, const Tensor& bias);
// x *= sigmoid(gate) (same shape).
void mul_sigmoid_inplace(const Exec& ex, const Tensor& x, const Tensor& gate);
// x[r, :] *= sigmoid(gate[r]). x: [N, C]; gate: [N] (or [N, 1]).
void mul_sigmoid_rows(const Exec& ex, const Tensor& x, const Tensor& gate);
// x *= silu(gate) (same numel).
void mul_silu_inplace(const Exec& ex, const Tensor& x, const Tensor& gate);
// x = sigmoid(x).
void sigmoid_inplace(const Exec& ex, const Tensor& x);
// dst[r, :] = src[r, col_begin : col_begin + dst.dim(1)] for every row r. src: [N, C]; dst: [N, c].
void copy_columns(const Exec& ex, const Tensor& src, int64_t col_begin, const Tensor& dst);
// dst[r, col_begin : col_begin + src.dim(1)] = src[r, :]. The inverse of copy_columns.
void scatter_columns(const Exec& ex, const Tensor& src, int64_t col_begin, const Tensor& dst);
// dst[i, :] = src[rows[i], :]. src: [N, C]; rows: [n] i64 on ex.device, each in [0, N) (checked on
// the host; step data on a GPU is built by the engine); dst: [n, C].
void gather_rows(const Exec& ex, const Tensor& src, const Tensor& rows, const Tensor& dst);

}  // namespace loom
