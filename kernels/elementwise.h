// Small elementwise and data-movement operations the model needs between the big kernels, and the
// backward passes a trainer needs of them. Contiguous f32 unless noted.
//
// Dtypes: on CUDA every activation argument of the forward ops (all but add_bias's bias) may be
// bf16 instead, each independently of the others: the kernels compute in f32 and round bf16
// stores to nearest even, so add_inplace of a bf16 delta into an f32 residual, or copy_columns
// from f32 into bf16, convert as they go. An output may overlap an input only with the same dtype.
// The CPU kernels and every backward pass take f32 only.
//
// Backward convention (llm.c's): activation gradients are written, parameter gradients (a bias)
// accumulated. An elementwise backward reads every input at index i before writing index i, so its
// outputs may alias its inputs (but not each other). Ops without a backward here have one for free:
// add_inplace passes its gradient through unchanged to both operands; copy_columns' backward is
// scatter_columns into a zeroed gradient and the reverse.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/exec.h"

namespace loom {

// Every byte of `t` (contiguous, any dtype) set to zero: a fresh gradient or recurrent state on
// either device (Tensor::fill is host only).
void zero_fill(const Exec& ex, const Tensor& t);
// dst += src (same shape).
void add_inplace(const Exec& ex, const Tensor& dst, const Tensor& src);
// x[r, :] += bias for every row r. x: [N, C]; bias: [C] f32.
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

// Backward of add_bias: dbias += sum over rows of dx (a parameter gradient: accumulated; each
// column summed in row order whatever the thread count). dx: [N, C]; dbias: [C].
void add_bias_backward(const Exec& ex, const Tensor& dx, const Tensor& dbias);
// Backward of mul_sigmoid_inplace at its input x (before the multiply): dx = dout * sigmoid(gate),
// dgate = dout * x * sigmoid(gate) * (1 - sigmoid(gate)). All the same numel.
void mul_sigmoid_backward(const Exec& ex, const Tensor& x, const Tensor& gate, const Tensor& dout,
                          const Tensor& dx, const Tensor& dgate);
// Backward of mul_sigmoid_rows at its input x: dx[r, :] = dout[r, :] * sigmoid(gate[r]),
// dgate[r] = sigmoid'(gate[r]) * (dout[r, :] . x[r, :]). x, dout, dx: [N, C]; gate, dgate: [N]
// (or [N, 1]).
void mul_sigmoid_rows_backward(const Exec& ex, const Tensor& x, const Tensor& gate,
                               const Tensor& dout, const Tensor& dx, const Tensor& dgate);
// Backward of mul_silu_inplace at its input x: dx = dout * silu(gate),
// dgate = dout * x * silu'(gate). All the same numel.
void mul_silu_backward(const Exec& ex, const Tensor& x, const Tensor& gate, const Tensor& dout,
                       const Tensor& dx, const Tensor& dgate);
// Backward of sigmoid_inplace from its output y = sigmoid(x): dx = dout * y * (1 - y).
void sigmoid_backward(const Exec& ex, const Tensor& y, const Tensor& dout, const Tensor& dx);
// Backward of gather_rows: dsrc[rows[i], :] += ddst[i, :] (accumulated: zero dsrc first for a
// plain gradient; rows never gathered get nothing). Deterministic: every row of dsrc receives its
// rows in index order whatever the thread count. ddst: [n, C]; rows: [n] i64, each in [0, N)
// (checked before anything is written); dsrc: [N, C].
void gather_rows_backward(const Exec& ex, const Tensor& ddst, const Tensor& rows,
                          const Tensor& dsrc);

}  // namespace loom
