// CUDA twins of the same-named kernels/ header: same contracts, every tensor argument on the GPU
// (f32 contiguous), enqueued on loom::cuda::current_stream() without synchronising.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/cuda/check.h"

namespace loom::cuda {

void add_inplace(const Tensor& dst, const Tensor& src);
void add_bias(const Tensor& x, const Tensor& bias);
void mul_sigmoid_inplace(const Tensor& x, const Tensor& gate);
void mul_sigmoid_rows(const Tensor& x, const Tensor& gate);
void mul_silu_inplace(const Tensor& x, const Tensor& gate);
void sigmoid_inplace(const Tensor& x);
void copy_columns(const Tensor& src, int64_t col_begin, const Tensor& dst);
void scatter_columns(const Tensor& src, int64_t col_begin, const Tensor& dst);
// `rows` is a host vector: every row is checked on the host (abort like the CPU kernel) and the
// list is uploaded to a stream-ordered scratch buffer.
void gather_rows(const Tensor& src, const std::vector<int64_t>& rows, const Tensor& dst);

}  // namespace loom::cuda
