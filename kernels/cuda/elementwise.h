// CUDA twins of the same-named kernels/ header: same contracts, every tensor argument on the GPU
// and contiguous, enqueued on the Exec's stream without synchronising. Every activation argument
// is f32 or bf16, independently of the others (math in f32, bf16 stores rounded to nearest even);
// an output may overlap an input only with the same dtype. add_bias's bias stays f32.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/cuda/check.h"
#include "kernels/exec.h"

namespace loom::cuda {

// cudaMemsetAsync on the Exec's stream.
void zero_fill(const Exec& ex, const Tensor& t);
void add_inplace(const Exec& ex, const Tensor& dst, const Tensor& src);
void add_bias(const Exec& ex, const Tensor& x, const Tensor& bias);
void mul_sigmoid_inplace(const Exec& ex, const Tensor& x, const Tensor& gate);
void mul_sigmoid_rows(const Exec& ex, const Tensor& x, const Tensor& gate);
void mul_silu_inplace(const Exec& ex, const Tensor& x, const Tensor& gate);
void sigmoid_inplace(const Exec& ex, const Tensor& x);
void copy_columns(const Exec& ex, const Tensor& src, int64_t col_begin, const Tensor& dst);
void scatter_columns(const Exec& ex, const Tensor& src, int64_t col_begin, const Tensor& dst);
// `rows` is device step data (i64); rows outside [0, N) write a zero row.
void gather_rows(const Exec& ex, const Tensor& src, const Tensor& rows, const Tensor& dst);

}  // namespace loom::cuda
