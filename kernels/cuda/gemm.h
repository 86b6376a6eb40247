// CUDA twins of the same-named kernels/ header: same contracts, every tensor argument on the GPU
// (f32 contiguous), enqueued on the Exec's stream without synchronising.
#pragma once

#include "core/tensor.h"
#include "kernels/cuda/check.h"
#include "kernels/exec.h"

namespace loom::cuda {

// cuBLAS cublasSgemm in CUBLAS_DEFAULT_MATH: true f32 (no TF32 tensor-core rounding), on the
// cuBLAS handle of the Exec's device context, bound to its stream. beta = 0 never reads
// out (it may hold NaN).
void linear_forward(const Exec& ex, const Tensor& x, const Tensor& w, const Tensor& out,
                    float beta);
void matmul(const Exec& ex, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
            const Tensor& out, float alpha, float beta);

}  // namespace loom::cuda
