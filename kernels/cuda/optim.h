// CUDA twins of kernels/optim.h (contracts checked there): every tensor on the GPU, enqueued on
// the Exec's stream. The AdamW update is the CPU's arithmetic element by element; the sum of
// squares adds fixed 4096-element blocks in double (a block tree inside each block), then the
// blocks in order: the same bits for the same input, and within an f32 rounding of the CPU's.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/tensor.h"
#include "kernels/exec.h"
#include "kernels/optim.h"

namespace loom::cuda {

void adamw_update(const Exec& ex, const AdamWStep& s, const Tensor& param, const Tensor& grad,
                  const Tensor& m, const Tensor& v);
void sum_of_squares(const Exec& ex, const Tensor& x, const Tensor& out);

namespace launch {
// step_size = lr / (1 - beta1^step), sqrt_bc2 = sqrt(1 - beta2^step), decay = 1 - lr * wd.
void adamw(cudaStream_t stream, float* p, const float* g, float* m, float* v, int64_t n,
           float grad_scale, float beta1, float beta2, float eps, float step_size, float sqrt_bc2,
           float decay);
// partials: ceil(n / 4096) doubles of scratch; out: one f32.
void sum_of_squares(cudaStream_t stream, const float* x, int64_t n, double* partials, float* out);
inline constexpr int64_t kSumSquaresBlock = 4096;
}  // namespace launch

}  // namespace loom::cuda
