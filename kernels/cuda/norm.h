// CUDA twins of the same-named kernels/ header: same contracts, every tensor argument on the GPU
// (f32 contiguous), enqueued on loom::cuda::current_stream() without synchronising.
#pragma once

#include "core/tensor.h"
#include "kernels/cuda/check.h"

namespace loom::cuda {

void rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, float weight_offset,
                     const Tensor& out);
void l2norm_forward(const Tensor& x, float eps, float scale, const Tensor& out);

}  // namespace loom::cuda
