// CUDA twins of the same-named kernels/ header: same contracts, every tensor argument on the GPU
// and contiguous, enqueued on the Exec's stream without synchronising. x and out are each f32 or
// bf16 (out aliases x only with the same dtype); w stays f32.
#pragma once

#include "core/tensor.h"
#include "kernels/cuda/check.h"
#include "kernels/exec.h"

namespace loom::cuda {

void rmsnorm_forward(const Exec& ex, const Tensor& x, const Tensor& w, float eps,
                     float weight_offset, const Tensor& out);
void add_rmsnorm_forward(const Exec& ex, const Tensor& h, const Tensor& delta, const Tensor& w,
                         float eps, float weight_offset, const Tensor& out);
void l2norm_forward(const Exec& ex, const Tensor& x, float eps, float scale, const Tensor& out);

}  // namespace loom::cuda
