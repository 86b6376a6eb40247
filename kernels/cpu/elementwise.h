// CPU implementations of kernels/elementwise.h (same contracts).
#pragma once

#include <vector>

#include "core/tensor.h"

namespace loom::cpu {

void add_inplace(const Tensor& dst, const Tensor& src);
void add_bias(const Tensor& x, const Tensor& bias);
void mul_sigmoid_inplace(const Tensor& x, const Tensor& gate);
void mul_sigmoid_rows(const Tensor& x, const Tensor& gate);
void mul_silu_inplace(const Tensor& x, const Tensor& gate);
void sigmoid_inplace(const Tensor& x);
void copy_columns(const Tensor& src, int64_t col_begin, const Tensor& dst);
void scatter_columns(const Tensor& src, int64_t col_begin, const Tensor& dst);
void gather_rows(const Tensor& src, const Tensor& rows, const Tensor& dst);

// Backward passes; contracts checked by kernels/elementwise.cc (and kernels/activation.cc).
void add_bias_backward(const Tensor& dx, const Tensor& dbias);
// mul_sigmoid_backward (silu = false) and mul_silu_backward (silu = true).
void mul_gate_backward(const Tensor& x, const Tensor& gate, const Tensor& dout, const Tensor& dx,
                       const Tensor& dgate, bool silu);
void mul_sigmoid_rows_backward(const Tensor& x, const Tensor& gate, const Tensor& dout,
                               const Tensor& dx, const Tensor& dgate);
void sigmoid_backward(const Tensor& y, const Tensor& dout, const Tensor& dx);
// dst[ids[i], :] += src[i, :]: gather_rows_backward and embedding_backward. ids: [n] i32 or i64,
// each checked in [0, dst.dim(0)) before anything is written (`op` names the caller).
void scatter_add_rows(const char* op, const Tensor& src, const Tensor& ids, const Tensor& dst);

}  // namespace loom::cpu
