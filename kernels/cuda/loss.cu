// Row kernels of the CUDA fused cross-entropy (launchers in loss_launch.h; the GEMMs and the
// chunk loop are in loss.cc).
//
// Determinism: every reduction has a fixed shape. A row's log-sum-exp over a vocabulary chunk is
// one block: thread k folds columns k, k + kRowThreads, ... in order into an online (max, sum)
// pair, then the pairs meet in a fixed tree (warp shuffles, then warp 0 over the warps' pairs);
// the chunks are folded into the row's running pair in vocabulary order. The loss total is one
// block's strided double sums and a fixed tree. No atomics: the same inputs give the same bits.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/loss_launch.h"

namespace loom::cuda {
namespace {

constexpr int kRowThreads = 512;    // one block per row for the log-sum-exp
constexpr int kEltThreads = 256;    // elementwise kernels
constexpr int kEltPerBlock = 4096;  // dlogits columns per block (16 per thread)
constexpr int kTotalThreads = 256;  // the loss total

__device__ __forceinline__ int64_t target_at(const void* targets, bool i64, int64_t t) {
  return i64 ? static_cast<const int64_t*>(targets)[t]
             : static_cast<int64_t>(static_cast<const int32_t*>(targets)[t]);
}

// The (max, sum) pair of {a's terms} u {b's terms}, sum relative to the max. A side with no terms
// has max -inf and sum 0, and contributes 0 (not 0 * exp(nan)).
__device__ __forceinline__ void lse_merge(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  const float a = m == -INFINITY ? 0.0f : s * expf(m - mx);
  const float b = m2 == -INFINITY ? 0.0f : s2 * expf(m2 - mx);
  m = mx;
  s = a + b;
}

__global__ void zero_ignored_kernel(const void* __restrict__ targets, bool i64, int64_t ignore,
                                    int64_t T, int64_t D, float* __restrict__ row_loss,
                                    float* __restrict__ dhidden) {
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    if (target_at(targets, i64, t) != ignore) continue;
    if (row_loss != nullptr && threadIdx.x == 0) row_loss[t] = 0.0f;
    if (dhidden != nullptr)
      for (int64_t j = threadIdx.x; j < D; j += blockDim.x) dhidden[t * D + j] = 0.0f;
  }
}

__global__ void copy_rows_kernel(const float* __restrict__ src, const int32_t* __restrict__ row_of,
                                 int64_t D, bool scatter, float* __restrict__ dst) {
  const int64_t i = blockIdx.x;
  const int64_t r = row_of[i];
  const float* s = src + (scatter ? i : r) * D;
  float* d = dst + (scatter ? r : i) * D;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) d[j] = s[j];
}

__global__ void __launch_bounds__(kRowThreads)
    lse_chunk_kernel(const float* __restrict__ logits, int64_t vc, int64_t v0,
                     const void* __restrict__ targets, bool i64, const int32_t* __restrict__ row_of,
                     bool first, bool last, const float* __restrict__ row_weight, float loss_scale,
                     float mean_coef, float* __restrict__ row_loss, launch::CeRowState st) {
  __shared__ float sm[kRowThreads / 32], ss[kRowThreads / 32];
  const int64_t i = blockIdx.x;
  const float* l = logits + i * vc;
  // Online fold of this thread's columns: one exp per element.
  float m = -INFINITY, s = 0.0f;
  for (int64_t j = threadIdx.x; j < vc; j += kRowThreads) {
    const float x = l[j];
    if (x > m) {
      s = (m == -INFINITY ? 0.0f : s * expf(m - x)) + 1.0f;
      m = x;
    } else {
      s += x == -INFINITY ? 0.0f : expf(x - m);  // m may be -inf too; a NaN x still propagates
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_down_sync(0xffffffffu, m, o);
    const float s2 = __shfl_down_sync(0xffffffffu, s, o);
    lse_merge(m, s, m2, s2);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sm[warp] = m;
    ss[warp] = s;
  }
  __syncthreads();
  if (warp != 0) return;
  constexpr int kWarps = kRowThreads / 32;
  m = lane < kWarps ? sm[lane] : -INFINITY;
  s = lane < kWarps ? ss[lane] : 0.0f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_down_sync(0xffffffffu, m, o);
    const float s2 = __shfl_down_sync(0xffffffffu, s, o);
    lse_merge(m, s, m2, s2);
  }
  if (lane != 0) return;
  if (!first) lse_merge(m, s, st.run_max[i], st.run_sum[i]);
  st.run_max[i] = m;
  st.run_sum[i] = s;
  const int64_t row = row_of[i];
  const int64_t y = target_at(targets, i64, row);
  if (y >= v0 && y < v0 + vc) st.target_logit[i] = l[y - v0];
  if (!last) return;
  const float lse = m + logf(s);
  const float li = lse - st.target_logit[i];
  st.lse[i] = lse;
  if (row_loss != nullptr) row_loss[row] = li;
  if (row_weight != nullptr) {
    st.contrib[i] = static_cast<double>(row_weight[row]) * li;
    st.coef[i] = loss_scale * row_weight[row];
  } else {
    st.contrib[i] = li;
    st.coef[i] = mean_coef;
  }
}

__global__ void __launch_bounds__(kEltThreads)
    dlogits_kernel(float* __restrict__ logits, int64_t vc, int64_t v0,
                   const void* __restrict__ targets, bool i64, const int32_t* __restrict__ row_of,
                   const float* __restrict__ lse, const float* __restrict__ coef) {
  const int64_t i = blockIdx.y;
  const float lse_i = lse[i], c = coef[i];
  const int64_t y = target_at(targets, i64, row_of[i]) - v0;
  float* l = logits + i * vc;
  const int64_t end = min(vc, static_cast<int64_t>(blockIdx.x + 1) * kEltPerBlock);
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * kEltPerBlock + threadIdx.x; j < end;
       j += kEltThreads) {
    float g = expf(l[j] - lse_i) * c;
    if (j == y) g -= c;
    l[j] = g;
  }
}

__global__ void __launch_bounds__(kTotalThreads)
    loss_total_kernel(const double* __restrict__ contrib, int64_t n, bool weighted,
                      float* __restrict__ loss) {
  __shared__ double sd[kTotalThreads];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += kTotalThreads) acc += contrib[i];
  sd[threadIdx.x] = acc;
  __syncthreads();
  for (int w = kTotalThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) sd[threadIdx.x] += sd[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x != 0) return;
  if (weighted)
    *loss = static_cast<float>(sd[0]);
  else
    *loss = n > 0 ? static_cast<float>(sd[0] / static_cast<double>(n)) : 0.0f;
}

}  // namespace

namespace launch {

void ce_zero_ignored(cudaStream_t stream, const void* targets, bool targets_i64,
                     int64_t ignore_index, int64_t T, int64_t D, float* row_loss, float* dhidden) {
  if (T == 0 || (row_loss == nullptr && dhidden == nullptr)) return;
  zero_ignored_kernel<<<dev::grid_for(T, 1), kEltThreads, 0, stream>>>(
      targets, targets_i64, ignore_index, T, D, row_loss, dhidden);
  LOOM_CUDA_CHECK_LAUNCH();
}

void ce_copy_rows(cudaStream_t stream, const float* src, const int32_t* row_of, int64_t rows,
                  int64_t D, bool scatter, float* dst) {
  if (rows == 0 || D == 0) return;
  LOOM_CHECK_GRID(rows);
  copy_rows_kernel<<<static_cast<unsigned>(rows), kEltThreads, 0, stream>>>(src, row_of, D, scatter,
                                                                            dst);
  LOOM_CUDA_CHECK_LAUNCH();
}

void ce_lse_chunk(cudaStream_t stream, const float* logits, int64_t rows, int64_t vc, int64_t v0,
                  const void* targets, bool targets_i64, const int32_t* row_of, bool first,
                  bool last, const float* row_weight, float loss_scale, float mean_coef,
                  float* row_loss, const CeRowState& st) {
  if (rows == 0) return;
  LOOM_CHECK_GRID(rows);
  lse_chunk_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
      logits, vc, v0, targets, targets_i64, row_of, first, last, row_weight, loss_scale, mean_coef,
      row_loss, st);
  LOOM_CUDA_CHECK_LAUNCH();
}

void ce_dlogits_chunk(cudaStream_t stream, float* logits, int64_t rows, int64_t vc, int64_t v0,
                      const void* targets, bool targets_i64, const int32_t* row_of,
                      const float* lse, const float* coef) {
  if (rows == 0 || vc == 0) return;
  if (rows > 65535) {  // grid y limit; loss.cc's row chunks are far smaller
    std::fprintf(stderr, "%s:%d: ce_dlogits_chunk: %lld rows exceed the grid's y limit\n", __FILE__,
                 __LINE__, static_cast<long long>(rows));
    std::abort();
  }
  const dim3 grid(static_cast<unsigned>((vc + kEltPerBlock - 1) / kEltPerBlock),
                  static_cast<unsigned>(rows));
  dlogits_kernel<<<grid, kEltThreads, 0, stream>>>(logits, vc, v0, targets, targets_i64, row_of,
                                                   lse, coef);
  LOOM_CUDA_CHECK_LAUNCH();
}

void ce_loss_total(cudaStream_t stream, const double* contrib, int64_t n, bool weighted,
                   float* loss) {
  loss_total_kernel<<<1, kTotalThreads, 0, stream>>>(contrib, n, weighted, loss);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace launch
}  // namespace loom::cuda
