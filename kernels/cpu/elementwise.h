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

}  // namespace loom::cpu
