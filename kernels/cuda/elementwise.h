// CUDA twins of the same-named kernels/ header: same contracts, every tensor argument on the GPU
// (f32 contiguous), enqueued on the Exec's stream without synchronising.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/cuda/check.h"
#include "kernels/exec.h"

namespace loom::cuda {

void add_inplace(const Exec& ex, const Tensor& dst, const Tensor& src);
void add_bias(const Exec& ex, const Tensor& x, const Tensor& bias);
void mul_sigmoid_inplace(const Exec& ex, const Tensor& x, const Tensor& gate);
void mul_sigmoid_rows(const Exec& ex, const Tensor& x, const Tensor& gate);
void mul_silu_inplace(const Exec& ex, const Tensor& x, const Tensor& gate);
void sigmoid_inplace(const Exec& ex, const Tensor& x);
void copy_columns(const Exec& ex, const Tensor& src, int64_t col_begin, const Tensor& dst);
void scatter_columns(const Exec& ex, const Tensor& src, int64_t col_begin, const Tensor& dst);
// `rows` is a host vector: every row is checked on the host (abort like the CPU kernel) and the
// list is uploaded to a stream-ordered scratch buffer.
void gather_rows(const Exec& ex, const Tensor& src, const std::vector<int64_t>& rows,
                 const Tensor& dst);

}  // namespace loom::cuda
