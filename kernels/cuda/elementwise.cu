// Elementwise kernels (kernels/elementwise.h and silu_mul / embedding of kernels/activation.h):
// grid-stride loops over int64 indices.
#include "kernels/cuda/common.cuh"

namespace loom::cuda {
namespace {

template <launch::Unary kOp>
__global__ void pointwise_kernel(float* x, const float* y, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if constexpr (kOp == launch::Unary::kAdd) {
      x[i] += y[i];
    } else if constexpr (kOp == launch::Unary::kMulSigmoid) {
      x[i] *= dev::sigmoid(y[i]);
    } else if constexpr (kOp == launch::Unary::kMulSilu) {
      const float g = y[i];
      x[i] *= g / (1.0f + expf(-g));
    } else if constexpr (kOp == launch::Unary::kSigmoid) {
      x[i] = dev::sigmoid(x[i]);
    } else {  // kSiluMul
      const float g = x[i];
      out[i] = g / (1.0f + expf(-g)) * y[i];
    }
  }
}

__global__ void add_bias_kernel(float* x, const float* __restrict__ b, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] += b[i % cols];
}

__global__ void mul_sigmoid_rows_kernel(float* x, const float* __restrict__ g, int64_t rows,
                                        int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] *= 1.0f / (1.0f + expf(-g[i / cols]));
}

// One block per output row; a bad id writes zeros (never reads or writes out of bounds).
template <typename Id>
__global__ void gather_kernel(const Id* __restrict__ ids, const float* __restrict__ table,
                              float* __restrict__ out, int64_t V, int64_t d, int32_t* bad) {
  const int64_t row = blockIdx.x;
  const int64_t id = static_cast<int64_t>(ids[row]);
  float* o = out + row * d;
  if (id < 0 || id >= V) {
    if (threadIdx.x == 0 && bad != nullptr) atomicMin(bad, static_cast<int32_t>(row));
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) o[i] = 0.0f;
    return;
  }
  const float* src = table + id * d;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) o[i] = src[i];
}

__global__ void fill_or_scale_kernel(float* x, int64_t n, float beta) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = beta == 0.0f ? 0.0f : beta * x[i];
}

constexpr int kThreads = 256;

template <typename Id>
void launch_gather(cudaStream_t stream, const Id* ids, const float* table, float* out, int64_t n,
                   int64_t V, int64_t d, int32_t* bad) {
  if (n == 0 || d == 0) return;
  LOOM_CHECK_GRID(n);
  const int threads = d >= 1024 ? 256 : (d >= 256 ? 128 : 64);
  gather_kernel<Id><<<static_cast<unsigned>(n), threads, 0, stream>>>(ids, table, out, V, d, bad);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace

namespace launch {

void pointwise(cudaStream_t stream, Unary op, float* x, const float* y, float* out, int64_t n) {
  if (n == 0) return;
  const unsigned grid = dev::grid_for(n, kThreads);
  cudaStream_t s = stream;
  switch (op) {
    case Unary::kAdd:
      pointwise_kernel<Unary::kAdd><<<grid, kThreads, 0, s>>>(x, y, out, n);
      break;
    case Unary::kMulSigmoid:
      pointwise_kernel<Unary::kMulSigmoid><<<grid, kThreads, 0, s>>>(x, y, out, n);
      break;
    case Unary::kMulSilu:
      pointwise_kernel<Unary::kMulSilu><<<grid, kThreads, 0, s>>>(x, y, out, n);
      break;
    case Unary::kSigmoid:
      pointwise_kernel<Unary::kSigmoid><<<grid, kThreads, 0, s>>>(x, y, out, n);
      break;
    case Unary::kSiluMul:
      pointwise_kernel<Unary::kSiluMul><<<grid, kThreads, 0, s>>>(x, y, out, n);
      break;
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

void add_bias(cudaStream_t stream, float* x, const float* bias, int64_t rows, int64_t cols) {
  if (rows * cols == 0) return;
  add_bias_kernel<<<dev::grid_for(rows * cols, kThreads), kThreads, 0, stream>>>(x, bias, rows,
                                                                                 cols);
  LOOM_CUDA_CHECK_LAUNCH();
}

void mul_sigmoid_rows(cudaStream_t stream, float* x, const float* gate, int64_t rows,
                      int64_t cols) {
  if (rows * cols == 0) return;
  mul_sigmoid_rows_kernel<<<dev::grid_for(rows * cols, kThreads), kThreads, 0, stream>>>(
      x, gate, rows, cols);
  LOOM_CUDA_CHECK_LAUNCH();
}

void copy_2d(cudaStream_t stream, float* dst, int64_t dst_ld, const float* src, int64_t src_ld,
             int64_t rows, int64_t cols) {
  if (rows == 0 || cols == 0) return;
  LOOM_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_ld * sizeof(float), src, src_ld * sizeof(float),
                                    cols * sizeof(float), rows, cudaMemcpyDeviceToDevice, stream));
}

void gather_rows_i32(cudaStream_t stream, const int32_t* ids, const float* table, float* out,
                     int64_t n, int64_t V, int64_t d, int32_t* bad) {
  launch_gather(stream, ids, table, out, n, V, d, bad);
}

void gather_rows_i64(cudaStream_t stream, const int64_t* ids, const float* table, float* out,
                     int64_t n, int64_t V, int64_t d, int32_t* bad) {
  launch_gather(stream, ids, table, out, n, V, d, bad);
}

void fill_or_scale(cudaStream_t stream, float* x, int64_t n, float beta) {
  if (n == 0) return;
  fill_or_scale_kernel<<<dev::grid_for(n, kThreads), kThreads, 0, stream>>>(x, n, beta);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace launch
}  // namespace loom::cuda
