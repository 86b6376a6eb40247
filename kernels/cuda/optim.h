// CUDA twins of kernels/optim.h (contracts checked there): every tensor on the GPU, enqueued on
// the Exec's stream. The AdamW update is the CPU's arithmetic element by element; the sum of
// squares adds fixed 4096-element blocks in double (a block tree inside each block), then the
// blocks in order: the same bits for the same input, and within an f32 rounding of the CPU's.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>

#include "core/tensor.h"
#include "kernels/exec.h"
#include "kernels/optim.h"

namespace loom::cuda {

void adamw_update(const Exec& ex, const AdamWStep& s, const Tensor& param, const Tensor& grad,
                  const Tensor& m, const Tensor& v);
void adamw_update_many(const Exec& ex, const AdamWStep& s, std::span<const AdamWTensor> tensors,
                       const GradScale& scale);
void sum_of_squares(const Exec& ex, const Tensor& x, const Tensor& out);

namespace launch {
// step_size = lr / (1 - beta1^step), sqrt_bc2 = sqrt(1 - beta2^step), decay = 1 - lr * wd.
void adamw(cudaStream_t stream, float* p, const float* g, float* m, float* v, int64_t n,
           float grad_scale, float beta1, float beta2, float eps, float step_size, float sqrt_bc2,
           float decay);
// partials: ceil(n / 4096) doubles of scratch; out: one f32.
void sum_of_squares(cudaStream_t stream, const float* x, int64_t n, double* partials, float* out);
inline constexpr int64_t kSumSquaresBlock = 4096;

// One launch of the multi-tensor update: up to kAdamWTensors tensors, passed by value (3.3 KB of
// kernel parameters), each split into blocks of kAdamWBlock elements; first_block is the tensor's
// first block of the launch's grid. The gradient scale is float(clipped_grad_scale(*sum_squares,
// mean, clip_norm)), computed by every thread from the sum on the device.
inline constexpr int kAdamWTensors = 64;
inline constexpr int64_t kAdamWBlock = 4096;
struct AdamWEntry {
  float* p;
  const float* g;
  float* m;
  float* v;
  int64_t n;
  int32_t first_block;
  float decay;  // 1 - lr * weight decay
};
struct AdamWLaunch {
  AdamWEntry e[kAdamWTensors];
  int count;
  int blocks;  // of the grid
  float beta1, beta2, eps, step_size, sqrt_bc2;
  const float* sum_squares;
  double mean, clip_norm;
};
void adamw_many(cudaStream_t stream, const AdamWLaunch& a);
}  // namespace launch

}  // namespace loom::cuda
