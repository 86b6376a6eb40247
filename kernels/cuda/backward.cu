// CUDA backward kernels of the norms, gates and row scatters (launchers in backward_launch.h):
// the formulas of their CPU twins (kernels/cpu/{norm,activation,elementwise}.cc), f32 throughout.
//
// Determinism: nothing is accumulated with atomics. Parameter gradients summed over rows (a norm's
// weight, a bias) go through column_sums: fixed chunks of rows into partials, the chunks then
// added in order, so the same inputs give the same bits at any occupancy. Row scatters (embedding
// and gather_rows backward) add each target row's sources in source order, the CPU's order, so
// they match it bit for bit.
#include "kernels/cuda/backward_launch.h"
#include "kernels/cuda/common.cuh"

namespace loom::cuda {
namespace {

constexpr int kRowThreads = 128;  // one block a row (rmsnorm dx, sigmoid rows)
constexpr int kWarpRows = 8;      // rows a block when a warp takes a row (rstd, l2norm)
constexpr int kColThreads = 256;  // column sums and scatters
constexpr int kPointThreads = 256;

__global__ void __launch_bounds__(kWarpRows * 32)
    row_rstd_kernel(const float* __restrict__ x, int64_t n, int64_t d, float eps,
                    float* __restrict__ rstd) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpRows + (threadIdx.x >> 5);
  if (r >= n) return;  // uniform across the warp
  const int lane = threadIdx.x & 31;
  const float* xr = x + r * d;
  float ss = 0.0f;
  for (int64_t i = lane; i < d; i += 32) ss += xr[i] * xr[i];
  ss = dev::warp_sum(ss);
  if (lane == 0) rstd[r] = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
}

__global__ void __launch_bounds__(kColThreads)
    column_partials_kernel(const float* __restrict__ dout, const float* __restrict__ x,
                           const float* __restrict__ rstd, int64_t n, int64_t c,
                           float* __restrict__ partials) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kColThreads + threadIdx.x;
  if (j >= c) return;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * launch::kColumnSumRows;
  const int64_t r1 = r0 + launch::kColumnSumRows < n ? r0 + launch::kColumnSumRows : n;
  float acc = 0.0f;
  for (int64_t r = r0; r < r1; ++r) {
    const float g = dout[r * c + j];
    if (x == nullptr) {
      acc += g;
    } else {
      acc += g * (x[r * c + j] * (rstd != nullptr ? rstd[r] : 1.0f));
    }
  }
  partials[static_cast<int64_t>(blockIdx.y) * c + j] = acc;
}

__global__ void __launch_bounds__(kColThreads)
    column_total_kernel(const float* __restrict__ partials, int64_t chunks, int64_t c,
                        float* __restrict__ dw) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kColThreads + threadIdx.x;
  if (j >= c) return;
  float s = 0.0f;
  for (int64_t k = 0; k < chunks; ++k) s += partials[k * c + j];
  dw[j] += s;
}

// Every element of a row is read before any is written (the block sum synchronises), and each
// thread writes only the elements it read: dx may alias x or dout.
__global__ void __launch_bounds__(kRowThreads)
    rmsnorm_dx_kernel(const float* x, const float* __restrict__ w, float off, const float* dout,
                      const float* __restrict__ rstd, int64_t d, float* dx) {
  __shared__ float smem[32];
  const int64_t r = blockIdx.x;
  const float* xr = x + r * d;
  const float* gr = dout + r * d;
  const float rs = rstd[r];
  float dot = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += kRowThreads) dot += (off + w[i]) * gr[i] * (xr[i] * rs);
  const float mean = dev::block_sum(dot, smem) / static_cast<float>(d);
  float* dxr = dx + r * d;
  for (int64_t i = threadIdx.x; i < d; i += kRowThreads) {
    const float xi = xr[i], gi = gr[i];
    dxr[i] = rs * ((off + w[i]) * gi - (xi * rs) * mean);
  }
}

__global__ void __launch_bounds__(kWarpRows * 32)
    l2norm_dx_kernel(const float* x, const float* dout, int64_t n, int64_t d, float eps,
                     float scale, float* dx) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpRows + (threadIdx.x >> 5);
  if (r >= n) return;  // uniform across the warp
  const int lane = threadIdx.x & 31;
  const float* xr = x + r * d;
  const float* gr = dout + r * d;
  float ss = 0.0f, dot = 0.0f;
  for (int64_t i = lane; i < d; i += 32) {
    ss += xr[i] * xr[i];
    dot += xr[i] * gr[i];
  }
  ss = dev::warp_sum(ss);
  dot = dev::warp_sum(dot);
  const float nsq = ss + eps;
  const float mul = scale / sqrtf(nsq);
  const float proj = dot / nsq;
  float* dxr = dx + r * d;
  for (int64_t i = lane; i < d; i += 32) {
    const float xi = xr[i], gi = gr[i];
    dxr[i] = mul * (gi - xi * proj);
  }
}

// sigmoid and 1 - sigmoid computed apart (the CPU's way: no cancellation near s = 1).
__device__ __forceinline__ void sig_pair(float g, float& s, float& sn) {
  s = 1.0f / (1.0f + expf(-g));
  sn = 1.0f / (1.0f + expf(g));
}

template <launch::GateGrad kKind>
__global__ void __launch_bounds__(kPointThreads)
    gate_backward_kernel(const float* a, const float* b, const float* dout, int64_t n, float* da,
                         float* db) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kPointThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kPointThreads) {
    const float ai = a[i], bi = b[i], di = dout[i];
    if constexpr (kKind == launch::GateGrad::kSiluMul) {  // a = gate, b = up
      float s, sn;
      sig_pair(ai, s, sn);
      da[i] = di * bi * (s * (1.0f + ai * sn));
      db[i] = di * (ai * s);
    } else if constexpr (kKind == launch::GateGrad::kMulSigmoid) {  // a = x, b = gate
      float s, sn;
      sig_pair(bi, s, sn);
      da[i] = di * s;
      db[i] = di * ai * (s * sn);
    } else {  // kMulSilu: a = x, b = gate
      float s, sn;
      sig_pair(bi, s, sn);
      da[i] = di * (bi * s);
      db[i] = di * ai * (s * (1.0f + bi * sn));
    }
  }
}

__global__ void __launch_bounds__(kPointThreads)
    sigmoid_backward_kernel(const float* y, const float* dout, int64_t n, float* dx) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kPointThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kPointThreads) {
    const float yi = y[i];
    dx[i] = dout[i] * (yi * (1.0f - yi));
  }
}

// gate[r] is read by every thread before the block sum's barrier, and dgate[r] written after it:
// dgate may alias gate, dx may alias x or dout (each thread writes what it read).
__global__ void __launch_bounds__(kRowThreads)
    mul_sigmoid_rows_backward_kernel(const float* x, const float* gate, const float* dout,
                                     int64_t c, float* dx, float* dgate) {
  __shared__ float smem[32];
  const int64_t r = blockIdx.x;
  float s, sn;
  sig_pair(gate[r], s, sn);
  float dot = 0.0f;
  for (int64_t i = threadIdx.x; i < c; i += kRowThreads) dot += dout[r * c + i] * x[r * c + i];
  dot = dev::block_sum(dot, smem);
  for (int64_t i = threadIdx.x; i < c; i += kRowThreads) dx[r * c + i] = dout[r * c + i] * s;
  if (threadIdx.x == 0) dgate[r] = dot * (s * sn);
}

__global__ void __launch_bounds__(kColThreads)
    scatter_add_segments_kernel(const float* __restrict__ src, const int64_t* __restrict__ perm,
                                const int64_t* __restrict__ seg_begin,
                                const int64_t* __restrict__ seg_row, int64_t c,
                                float* __restrict__ dst) {
  const int64_t j = static_cast<int64_t>(blockIdx.y) * kColThreads + threadIdx.x;
  if (j >= c) return;
  const int64_t s = blockIdx.x;
  float* d = dst + seg_row[s] * c + j;
  float acc = *d;
  for (int64_t k = seg_begin[s]; k < seg_begin[s + 1]; ++k) acc += src[perm[k] * c + j];
  *d = acc;
}

unsigned blocks_of(int64_t n, int per_block) {
  const int64_t b = (n + per_block - 1) / per_block;
  LOOM_CHECK_GRID(b);
  return static_cast<unsigned>(b);
}

void check_y(int64_t blocks, const char* what) {
  if (blocks > 65535) {
    std::fprintf(stderr, "%s (CUDA): %lld column blocks exceed the grid's y limit\n", what,
                 static_cast<long long>(blocks));
    std::abort();
  }
}

}  // namespace

namespace launch {

void row_rstd(cudaStream_t stream, const float* x, int64_t n, int64_t d, float eps, float* rstd) {
  if (n == 0) return;
  row_rstd_kernel<<<blocks_of(n, kWarpRows), kWarpRows * 32, 0, stream>>>(x, n, d, eps, rstd);
  LOOM_CUDA_CHECK_LAUNCH();
}

void column_sums(cudaStream_t stream, const float* dout, const float* x, const float* rstd,
                 int64_t n, int64_t c, float* partials, float* dw) {
  if (n == 0 || c == 0) return;
  const int64_t chunks = (n + kColumnSumRows - 1) / kColumnSumRows;
  check_y(chunks, "column_sums");
  const dim3 grid(blocks_of(c, kColThreads), static_cast<unsigned>(chunks));
  column_partials_kernel<<<grid, kColThreads, 0, stream>>>(dout, x, rstd, n, c, partials);
  LOOM_CUDA_CHECK_LAUNCH();
  column_total_kernel<<<blocks_of(c, kColThreads), kColThreads, 0, stream>>>(partials, chunks, c,
                                                                             dw);
  LOOM_CUDA_CHECK_LAUNCH();
}

void rmsnorm_dx(cudaStream_t stream, const float* x, const float* w, float off, const float* dout,
                const float* rstd, int64_t n, int64_t d, float* dx) {
  if (n == 0) return;
  rmsnorm_dx_kernel<<<blocks_of(n, 1), kRowThreads, 0, stream>>>(x, w, off, dout, rstd, d, dx);
  LOOM_CUDA_CHECK_LAUNCH();
}

void l2norm_dx(cudaStream_t stream, const float* x, const float* dout, int64_t n, int64_t d,
               float eps, float scale, float* dx) {
  if (n == 0) return;
  l2norm_dx_kernel<<<blocks_of(n, kWarpRows), kWarpRows * 32, 0, stream>>>(x, dout, n, d, eps,
                                                                           scale, dx);
  LOOM_CUDA_CHECK_LAUNCH();
}

void gate_backward(cudaStream_t stream, GateGrad kind, const float* a, const float* b,
                   const float* dout, int64_t n, float* da, float* db) {
  if (n == 0) return;
  const unsigned grid = dev::grid_for(n, kPointThreads);
  switch (kind) {
    case GateGrad::kSiluMul:
      gate_backward_kernel<GateGrad::kSiluMul>
          <<<grid, kPointThreads, 0, stream>>>(a, b, dout, n, da, db);
      break;
    case GateGrad::kMulSigmoid:
      gate_backward_kernel<GateGrad::kMulSigmoid>
          <<<grid, kPointThreads, 0, stream>>>(a, b, dout, n, da, db);
      break;
    case GateGrad::kMulSilu:
      gate_backward_kernel<GateGrad::kMulSilu>
          <<<grid, kPointThreads, 0, stream>>>(a, b, dout, n, da, db);
      break;
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

void sigmoid_backward(cudaStream_t stream, const float* y, const float* dout, int64_t n,
                      float* dx) {
  if (n == 0) return;
  sigmoid_backward_kernel<<<dev::grid_for(n, kPointThreads), kPointThreads, 0, stream>>>(y, dout, n,
                                                                                         dx);
  LOOM_CUDA_CHECK_LAUNCH();
}

void mul_sigmoid_rows_backward(cudaStream_t stream, const float* x, const float* gate,
                               const float* dout, int64_t n, int64_t c, float* dx, float* dgate) {
  if (n == 0) return;
  mul_sigmoid_rows_backward_kernel<<<blocks_of(n, 1), kRowThreads, 0, stream>>>(x, gate, dout, c,
                                                                                dx, dgate);
  LOOM_CUDA_CHECK_LAUNCH();
}

void scatter_add_segments(cudaStream_t stream, const float* src, const int64_t* perm,
                          const int64_t* seg_begin, const int64_t* seg_row, int64_t segments,
                          int64_t c, float* dst) {
  if (segments == 0 || c == 0) return;
  const int64_t col_blocks = (c + kColThreads - 1) / kColThreads;
  check_y(col_blocks, "scatter_add_segments");
  const dim3 grid(blocks_of(segments, 1), static_cast<unsigned>(col_blocks));
  scatter_add_segments_kernel<<<grid, kColThreads, 0, stream>>>(src, perm, seg_begin, seg_row, c,
                                                                dst);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace launch
}  // namespace loom::cuda
