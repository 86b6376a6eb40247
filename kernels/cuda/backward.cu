// CUDA backward kernels of the norms, gates and row scatters (launchers in backward_launch.h):
// the formulas of their CPU twins (kernels/cpu/{norm,activation,elementwise}.cc), f32 throughout.
//
// Determinism: nothing is accumulated with atomics. Parameter gradients summed over rows (a norm's
// weight, a bias) go through column_sums: fixed chunks of rows into partials, the chunks then
// added in order, so the same inputs give the same bits at any occupancy. Row scatters (embedding
// and gather_rows backward) add each target row's sources in source order, the CPU's order, so
// they match it bit for bit.
#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/attention_train_launch.h"
#include "kernels/cuda/backward_launch.h"
#include "kernels/cuda/common.cuh"

namespace loom::cuda {
namespace {

constexpr int kRowThreads = 128;  // one block a row (rmsnorm dx, sigmoid rows)
constexpr int kWarpRows = 8;      // rows a block when a warp takes a row (rstd, l2norm)
constexpr int kColThreads = 256;  // column sums and scatters
constexpr int kPointThreads = 256;

// The sequence of a packed batch that row t belongs to: cu (i64 [nseq + 1] row offsets) names
// it; the largest s with cu[s] <= t (empty sequences before it skipped). Without cu, the one
// sequence [0, T).
struct RowSeq {
  int64_t s, begin, end;
};
__device__ __forceinline__ RowSeq row_seq(const int64_t* cu, int64_t nseq, int64_t T, int64_t t) {
  if (cu == nullptr) return {0, 0, T};
  int64_t lo = 0, hi = nseq;  // cu[lo] <= t, and cu[hi] > t or hi == nseq
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (cu[mid] <= t)
      lo = mid;
    else
      hi = mid;
  }
  return {lo, cu[lo], cu[lo + 1]};
}

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

// out[j] += sum over the chunks of partials[k, j] for the cols columns of partials [chunks, cols],
// column j going to out0[j], out1[j - width] or out2[j - 2 width] (width = cols with one output).
// A block takes 32 columns; its 8 rows of threads sum the chunks k = y mod 8 in order, then row 0
// adds the 8 rows in order: a fixed order whatever the occupancy (the same bits every run), with
// 8 times the parallelism of a thread per column over thousands of chunks.
constexpr int kTotalCols = 32, kTotalRows = 8;
__global__ void __launch_bounds__(kTotalCols* kTotalRows)
    ordered_column_total_kernel(const float* __restrict__ partials, int64_t chunks, int64_t cols,
                                int64_t width, float* out0, float* out1, float* out2) {
  __shared__ float rows[kTotalRows][kTotalCols + 1];
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kTotalCols + threadIdx.x;
  float s = 0.0f;
  if (j < cols)
    for (int64_t k = threadIdx.y; k < chunks; k += kTotalRows) s += partials[k * cols + j];
  rows[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || j >= cols) return;
  float t = 0.0f;
  for (int y = 0; y < kTotalRows; ++y) t += rows[y][threadIdx.x];
  const int64_t which = j / width;
  float* out = which == 0 ? out0 : which == 1 ? out1 : out2;
  out[j - which * width] += t;
}

void ordered_column_total(cudaStream_t stream, const float* partials, int64_t chunks, int64_t cols,
                          int64_t width, float* out0, float* out1, float* out2) {
  const dim3 block(kTotalCols, kTotalRows);
  ordered_column_total_kernel<<<static_cast<unsigned>((cols + kTotalCols - 1) / kTotalCols), block,
                                0, stream>>>(partials, chunks, cols, width, out0, out1, out2);
  LOOM_CUDA_CHECK_LAUNCH();
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
  ordered_column_total(stream, partials, chunks, c, c, dw, nullptr, nullptr);
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

// ---- causal_conv1d_backward -----------------------------------------------------------------
namespace loom::cuda {
namespace {

using launch::ConvBackwardArgs;

// xpad[t + j][c], the input under tap j of output row t: the initial state's rows, then x (zeros
// without a state, and before the first row of t's sequence, `begin`, in a packed batch).
__device__ __forceinline__ float conv_xpad(const ConvBackwardArgs& a, int64_t begin, int64_t t,
                                           int64_t j, int64_t c) {
  const int64_t r = t + j - (a.W - 1);
  if (r >= begin) return a.x[r * a.C + c];
  return a.s0 != nullptr ? a.s0[(t + j) * a.C + c] : 0.0f;  // a state only without a.cu
}

// The gradient at the activation's input of row t, channel c (begin: the first row of t's
// sequence): dout itself without the SiLU, else dout * silu'(pre) with pre recomputed in the
// forward's order (j = 0 .. W-1 from 0).
__device__ __forceinline__ float conv_dpre(const ConvBackwardArgs& a, int64_t begin, int64_t t,
                                           int64_t c) {
  const float g = a.dout[t * a.C + c];
  if (!a.silu) return g;
  float pre = 0.0f;
  for (int64_t j = 0; j < a.W; ++j) pre += a.weight[c * a.W + j] * conv_xpad(a, begin, t, j, c);
  float s, sn;
  sig_pair(pre, s, sn);
  return g * (s * (1.0f + pre * sn));
}

__global__ void __launch_bounds__(kPointThreads) conv_dpre_kernel(ConvBackwardArgs a) {
  const int64_t n = a.T * a.C;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kPointThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kPointThreads) {
    const int64_t t = i / a.C, c = i % a.C;
    a.dpre[i] = conv_dpre(a, row_seq(a.cu, a.num_seqs, a.T, t).begin, t, c);
  }
}

// The three passes below in one, for kernel widths up to 4 (the models' 4) when dx is memory of
// its own: a thread per channel and chunk of kColumnSumRows rows walks rows q = t0 .. t1 + W - 2
// in order, computing dpre(q) once and keeping the last W in registers; rows q < t1 add to the
// chunk's weight partials (conv_dweight_partials_kernel's sums, in its order), and once
// q = t + W - 1, row t's dx is complete (conv_dx_kernel's sum, in its order). dpre is written
// only where the initial state's gradient reads it (rows < W - 1). The same bits as the three
// kernels.
template <int kW>
__global__ void __launch_bounds__(kColThreads) conv_fused_backward_kernel(ConvBackwardArgs a) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColThreads + threadIdx.x;
  if (c >= a.C) return;
  constexpr int64_t P = kW - 1;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * launch::kColumnSumRows;
  const int64_t t1 = t0 + launch::kColumnSumRows < a.T ? t0 + launch::kColumnSumRows : a.T;
  const int64_t q1 = t1 + P < a.T ? t1 + P : a.T;  // rows whose dpre a dx of the chunk reads
  float w[kW], part[kW], win[kW];                  // win[i]: dpre(q - i), the rows before t0 unused
#pragma unroll
  for (int j = 0; j < kW; ++j) {
    w[j] = a.weight[c * kW + j];
    part[j] = 0.0f;
    win[j] = 0.0f;
  }
  RowSeq qs = row_seq(a.cu, a.num_seqs, a.T, t0);  // q's sequence
  RowSeq ts = qs;                                  // t = q - P's sequence (from t0 on)
  auto advance = [&](RowSeq& r, int64_t row) {
    while (row >= r.end) r = {r.s + 1, r.end, a.cu[r.s + 2]};
  };
  for (int64_t q = t0; q < q1 + P; ++q) {
#pragma unroll
    for (int j = kW - 1; j > 0; --j) win[j] = win[j - 1];
    if (q < q1) {
      advance(qs, q);
      win[0] = conv_dpre(a, qs.begin, q, c);
      if (q < P && a.ds0 != nullptr) a.dpre[q * a.C + c] = win[0];
      if (q < t1) {
#pragma unroll
        for (int j = 0; j < kW; ++j) part[j] += win[0] * conv_xpad(a, qs.begin, q, j, c);
      }
    }
    const int64_t t = q - P;
    if (t < t0 || t >= t1) continue;
    advance(ts, t);
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kW; ++j)  // tap j reads dpre(t + P - j) = win[j] (row q - j)
      if (t + P - j < ts.end) acc += w[j] * win[j];
    const int64_t r = t + P - a.T;
    if (a.dfin != nullptr && r >= 0) acc += a.dfin[r * a.C + c];
    a.dx[t * a.C + c] = acc;
  }
  float* out = a.partials + (static_cast<int64_t>(blockIdx.y) * a.C + c) * kW;
#pragma unroll
  for (int j = 0; j < kW; ++j) out[j] = part[j];
}

// partials[chunk, c, j] = sum over the chunk's t of dpre[t, c] * xpad[t + j, c], t ascending.
__global__ void __launch_bounds__(kColThreads) conv_dweight_partials_kernel(ConvBackwardArgs a) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColThreads + threadIdx.x;
  if (c >= a.C) return;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * launch::kColumnSumRows;
  const int64_t t1 = t0 + launch::kColumnSumRows < a.T ? t0 + launch::kColumnSumRows : a.T;
  float* out = a.partials + (static_cast<int64_t>(blockIdx.y) * a.C + c) * a.W;
  const RowSeq first = row_seq(a.cu, a.num_seqs, a.T, t0);
  for (int64_t j = 0; j < a.W; ++j) {
    float acc = 0.0f;
    RowSeq seq = first;  // rows ascend: step to the next sequence at each boundary
    for (int64_t t = t0; t < t1; ++t) {
      while (t >= seq.end) seq = {seq.s + 1, seq.end, a.cu[seq.s + 2]};
      acc += a.dpre[t * a.C + c] * conv_xpad(a, seq.begin, t, j, c);
    }
    out[j] = acc;
  }
}

__global__ void __launch_bounds__(kColThreads)
    conv_dweight_total_kernel(ConvBackwardArgs a, int64_t chunks) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kColThreads + threadIdx.x;  // c * W + j
  if (i >= a.C * a.W) return;
  float s = 0.0f;
  for (int64_t k = 0; k < chunks; ++k) s += a.partials[k * a.C * a.W + i];
  a.dweight[i] += s;
}

// Rows p < W-1 of dxpad: the initial state's gradient.
__global__ void __launch_bounds__(kPointThreads) conv_dstate_kernel(ConvBackwardArgs a) {
  const int64_t P = a.W - 1, n = P * a.C;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kPointThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kPointThreads) {
    const int64_t p = i / a.C, c = i % a.C;
    float acc = 0.0f;
    for (int64_t j = 0; j <= p; ++j)
      if (p - j < a.T) acc += a.weight[c * a.W + j] * a.dpre[(p - j) * a.C + c];
    if (a.dfin != nullptr && p >= a.T) acc += a.dfin[(p - a.T) * a.C + c];
    a.ds0[i] = acc;
  }
}

// Rows p = t + W-1 of dxpad: dx, plus the final state's gradient on the last W-1 of them. In a
// packed batch row t feeds only the rows of its own sequence.
__global__ void __launch_bounds__(kPointThreads) conv_dx_kernel(ConvBackwardArgs a) {
  const int64_t P = a.W - 1, n = a.T * a.C;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kPointThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kPointThreads) {
    const int64_t t = i / a.C, c = i % a.C;
    const int64_t end = row_seq(a.cu, a.num_seqs, a.T, t).end;
    float acc = 0.0f;
    for (int64_t j = 0; j < a.W; ++j) {
      const int64_t q = t + P - j;
      if (q < end) acc += a.weight[c * a.W + j] * a.dpre[q * a.C + c];
    }
    const int64_t r = t + P - a.T;
    if (a.dfin != nullptr && r >= 0) acc += a.dfin[r * a.C + c];
    a.dx[i] = acc;
  }
}

}  // namespace

namespace launch {
void causal_conv1d_backward(cudaStream_t stream, const ConvBackwardArgs& a) {
  if (a.C == 0) return;
  // The fused kernel reads dout and x rows of the next chunk while that chunk's threads write dx:
  // with dx in place of either, the three kernels below (dpre complete before any dx is written).
  const auto overlaps_dx = [&](const float* p) {
    const float* end = a.dx + a.T * a.C;
    return p < end && a.dx < p + a.T * a.C;
  };
  if (a.T > 0 && a.W >= 1 && a.W <= 4 && !overlaps_dx(a.dout) && !overlaps_dx(a.x)) {
    const int64_t chunks = (a.T + kColumnSumRows - 1) / kColumnSumRows;
    check_y(chunks, "causal_conv1d_backward");
    const dim3 grid(blocks_of(a.C, kColThreads), static_cast<unsigned>(chunks));
    switch (a.W) {
      case 1:
        conv_fused_backward_kernel<1><<<grid, kColThreads, 0, stream>>>(a);
        break;
      case 2:
        conv_fused_backward_kernel<2><<<grid, kColThreads, 0, stream>>>(a);
        break;
      case 3:
        conv_fused_backward_kernel<3><<<grid, kColThreads, 0, stream>>>(a);
        break;
      default:
        conv_fused_backward_kernel<4><<<grid, kColThreads, 0, stream>>>(a);
        break;
    }
    LOOM_CUDA_CHECK_LAUNCH();
    conv_dweight_total_kernel<<<blocks_of(a.C * a.W, kColThreads), kColThreads, 0, stream>>>(
        a, chunks);
    LOOM_CUDA_CHECK_LAUNCH();
    if (a.ds0 != nullptr && a.W > 1) {
      conv_dstate_kernel<<<dev::grid_for((a.W - 1) * a.C, kPointThreads), kPointThreads, 0,
                           stream>>>(a);
      LOOM_CUDA_CHECK_LAUNCH();
    }
    return;
  }
  if (a.T > 0) {
    conv_dpre_kernel<<<dev::grid_for(a.T * a.C, kPointThreads), kPointThreads, 0, stream>>>(a);
    LOOM_CUDA_CHECK_LAUNCH();
    const int64_t chunks = (a.T + kColumnSumRows - 1) / kColumnSumRows;
    check_y(chunks, "causal_conv1d_backward");
    const dim3 grid(blocks_of(a.C, kColThreads), static_cast<unsigned>(chunks));
    conv_dweight_partials_kernel<<<grid, kColThreads, 0, stream>>>(a);
    LOOM_CUDA_CHECK_LAUNCH();
    conv_dweight_total_kernel<<<blocks_of(a.C * a.W, kColThreads), kColThreads, 0, stream>>>(
        a, chunks);
    LOOM_CUDA_CHECK_LAUNCH();
  }
  if (a.ds0 != nullptr && a.W > 1) {
    conv_dstate_kernel<<<dev::grid_for((a.W - 1) * a.C, kPointThreads), kPointThreads, 0, stream>>>(
        a);
    LOOM_CUDA_CHECK_LAUNCH();
  }
  if (a.T > 0) {
    conv_dx_kernel<<<dev::grid_for(a.T * a.C, kPointThreads), kPointThreads, 0, stream>>>(a);
    LOOM_CUDA_CHECK_LAUNCH();
  }
}
}  // namespace launch
}  // namespace loom::cuda

// ---- kda_gate_backward ----------------------------------------------------------------------
namespace loom::cuda {
namespace {

// The CPU's formulas (kernels/cpu/kda_backward.cc): softplus gates without a lower bound,
// lb * sigmoid(a x) with one.
__global__ void __launch_bounds__(kPointThreads)
    kda_gate_grads_kernel(const float* f, const float* __restrict__ a_log,
                          const float* __restrict__ bias, float lb, const float* d_g, int64_t n,
                          int64_t width, int64_t per_head, float* d_f, float* __restrict__ d_alog) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kPointThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kPointThreads) {
    const int64_t c = i % width;
    const float a = expf(a_log[c / per_head]);
    const float x = f[i] + (bias != nullptr ? bias[c] : 0.0f);
    const float up = d_g[i];
    float dx, dalog;
    if (lb == 0.0f) {
      const float sp = x > 20.0f ? x : log1pf(expf(x));
      dx = -a / (1.0f + expf(-x));
      dalog = -a * sp;
    } else {
      const float s = 1.0f / (1.0f + expf(-a * x));
      dx = lb * s * (1.0f - s) * a;
      dalog = dx * x;
    }
    d_f[i] = up * dx;
    d_alog[i] = up * dalog;
  }
}

__global__ void group_sums_kernel(const float* __restrict__ cols, int64_t groups, int64_t per_group,
                                  float* __restrict__ out) {
  const int64_t h = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (h >= groups) return;
  float s = 0.0f;
  for (int64_t c = h * per_group; c < (h + 1) * per_group; ++c) s += cols[c];
  out[h] += s;
}

}  // namespace

namespace launch {
void kda_gate_grads(cudaStream_t stream, const float* f, const float* a_log, const float* bias,
                    float lower_bound, const float* d_g, int64_t T, int64_t width, int64_t H,
                    float* d_f, float* d_alog) {
  const int64_t n = T * width;
  if (n == 0) return;
  kda_gate_grads_kernel<<<dev::grid_for(n, kPointThreads), kPointThreads, 0, stream>>>(
      f, a_log, bias, lower_bound, d_g, n, width, width / H, d_f, d_alog);
  LOOM_CUDA_CHECK_LAUNCH();
}

void group_sums(cudaStream_t stream, const float* cols, int64_t groups, int64_t per_group,
                float* out) {
  if (groups == 0) return;
  group_sums_kernel<<<blocks_of(groups, kColThreads), kColThreads, 0, stream>>>(cols, groups,
                                                                                per_group, out);
  LOOM_CUDA_CHECK_LAUNCH();
}
}  // namespace launch
}  // namespace loom::cuda

// ---- MoE backward ---------------------------------------------------------------------------
namespace loom::cuda {
namespace {

__global__ void __launch_bounds__(kColThreads)
    moe_permute_backward_kernel(const float* __restrict__ src, const int32_t* __restrict__ rows,
                                int64_t K, int64_t D, float* __restrict__ d_x) {
  const int64_t c = static_cast<int64_t>(blockIdx.y) * kColThreads + threadIdx.x;
  if (c >= D) return;
  const int64_t t = blockIdx.x;
  const int32_t* row = rows + t * K;
  bool any = false;
  float acc = 0.0f;
  for (int64_t i = 0; i < K; ++i) {
    if (row[i] < 0) continue;
    const float g = src[static_cast<int64_t>(row[i]) * D + c];
    acc = any ? acc + g : g;
    any = true;
  }
  if (any) d_x[t * D + c] += acc;
}

// One block a slot: d_y's row, and the dot product in double (per-thread column-order partials,
// then a fixed tree).
__global__ void __launch_bounds__(kRowThreads)
    moe_combine_backward_kernel(const float* __restrict__ y, const int32_t* __restrict__ rows,
                                const float* __restrict__ w, const float* __restrict__ d_out,
                                int64_t K, int64_t D, float* __restrict__ d_y,
                                float* __restrict__ d_w) {
  __shared__ double s[kRowThreads];
  const int64_t j = blockIdx.x, t = j / K;
  const int32_t r = rows[j];
  if (r < 0) {
    if (threadIdx.x == 0) d_w[j] = 0.0f;
    return;
  }
  const float* g = d_out + t * D;
  const float* yr = y + static_cast<int64_t>(r) * D;
  float* dy = d_y + static_cast<int64_t>(r) * D;
  const float wj = w[j];
  double dot = 0.0;
  for (int64_t c = threadIdx.x; c < D; c += kRowThreads) {
    dot += static_cast<double>(g[c]) * yr[c];
    dy[c] = wj * g[c];
  }
  s[threadIdx.x] = dot;
  __syncthreads();
  for (int h = kRowThreads / 2; h > 0; h /= 2) {
    if (threadIdx.x < h) s[threadIdx.x] += s[threadIdx.x + h];
    __syncthreads();
  }
  if (threadIdx.x == 0) d_w[j] = static_cast<float>(s[0]);
}

// The CPU's row loop (kernels/cpu/moe.cc moe_route_backward), one thread a row. A row of
// d_logits is written only after the row's logits were read (d_logits may alias logits).
__global__ void __launch_bounds__(kPointThreads)
    moe_route_backward_kernel(const float* logits, const int32_t* __restrict__ ids,
                              const float* __restrict__ d_w, int64_t T, int64_t E, int64_t K,
                              bool sigmoid, bool renormalize, float c, float* __restrict__ s_buf,
                              float* __restrict__ ds_buf, float* d_logits) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kPointThreads + threadIdx.x;
  if (i >= T) return;
  const float* l = logits + i * E;
  const int32_t* id = ids + i * K;
  const float* dw = d_w + i * K;
  float* s = s_buf + i * E;
  float* ds = ds_buf + i * E;
  if (sigmoid) {
    for (int64_t j = 0; j < E; ++j) s[j] = 1.0f / (1.0f + expf(-l[j]));
  } else {
    float mx = -INFINITY;
    for (int64_t j = 0; j < E; ++j) mx = fmaxf(mx, l[j]);
    float sum = 0.0f;
    for (int64_t j = 0; j < E; ++j) {
      s[j] = expf(l[j] - mx);
      sum += s[j];
    }
    for (int64_t j = 0; j < E; ++j) s[j] /= sum;
  }
  for (int64_t j = 0; j < E; ++j) ds[j] = 0.0f;
  float dot = 0.0f, denom = 1.0f;
  if (renormalize) {
    float sum = 0.0f;
    for (int64_t j = 0; j < K; ++j) sum += s[id[j]];
    denom = sigmoid ? sum + 1e-20f : sum;
    for (int64_t j = 0; j < K; ++j) dot += dw[j] * (s[id[j]] / denom * c);
  }
  float sdot = 0.0f;  // softmax: sum(s * d_s) over the chosen experts
  for (int64_t j = 0; j < K; ++j) {
    const float da = renormalize ? (c * dw[j] - dot) / denom : c * dw[j];
    ds[id[j]] += da;
    sdot += s[id[j]] * da;
  }
  float* dl = d_logits + i * E;
  if (sigmoid) {
    for (int64_t j = 0; j < E; ++j) {
      const float lj = l[j];
      dl[j] = ds[j] == 0.0f ? 0.0f : ds[j] * (s[j] * (1.0f / (1.0f + expf(lj))));
    }
  } else {
    for (int64_t j = 0; j < E; ++j) dl[j] = s[j] * (ds[j] - sdot);
  }
}

}  // namespace

namespace launch {
void moe_permute_backward(cudaStream_t stream, const float* d_x_sorted, const int32_t* rows,
                          int64_t T, int64_t K, int64_t D, float* d_x) {
  if (T == 0 || D == 0) return;
  const int64_t col_blocks = (D + kColThreads - 1) / kColThreads;
  check_y(col_blocks, "moe_permute_backward");
  const dim3 grid(blocks_of(T, 1), static_cast<unsigned>(col_blocks));
  moe_permute_backward_kernel<<<grid, kColThreads, 0, stream>>>(d_x_sorted, rows, K, D, d_x);
  LOOM_CUDA_CHECK_LAUNCH();
}

void moe_unpermute_combine_backward(cudaStream_t stream, const float* y, const int32_t* rows,
                                    const float* w, const float* d_out, int64_t T, int64_t K,
                                    int64_t D, float* d_y, float* d_w) {
  if (T * K == 0) return;
  moe_combine_backward_kernel<<<blocks_of(T * K, 1), kRowThreads, 0, stream>>>(y, rows, w, d_out, K,
                                                                               D, d_y, d_w);
  LOOM_CUDA_CHECK_LAUNCH();
}

void moe_route_backward(cudaStream_t stream, const float* logits, const int32_t* ids,
                        const float* d_w, int64_t T, int64_t E, int64_t K, bool sigmoid,
                        bool renormalize, float scaling, float* s_scratch, float* ds_scratch,
                        float* d_logits) {
  if (T == 0) return;
  moe_route_backward_kernel<<<blocks_of(T, kPointThreads), kPointThreads, 0, stream>>>(
      logits, ids, d_w, T, E, K, sigmoid, renormalize, scaling, s_scratch, ds_scratch, d_logits);
  LOOM_CUDA_CHECK_LAUNCH();
}
}  // namespace launch
}  // namespace loom::cuda

// ---- attnres_aggregate_backward -------------------------------------------------------------
namespace loom::cuda {
namespace {

constexpr int kAttnResThreads = 256;

// The CPU's per-token recomputation and backward (kernels/cpu/attnres.cc), the sums over D as
// block reductions. Shared: mix, dm, du [D]; logit, inv, p, dp [S]; one scalar.
__global__ void __launch_bounds__(kAttnResThreads)
    attnres_backward_kernel(const float* src, const float* __restrict__ w,
                            const float* __restrict__ r, const float* __restrict__ o, float eps,
                            const float* __restrict__ gout, int64_t S, int64_t N, int64_t D,
                            float* dsrc, float* __restrict__ partials) {
  extern __shared__ float sh[];
  __shared__ float red[32];
  __shared__ float pdp_s;
  float* mix = sh;
  float* dm = mix + D;
  float* du = dm + D;
  float* logit = du + D;
  float* inv = logit + S;
  float* p = inv + S;
  float* dp = p + S;
  const float fd = static_cast<float>(D);
  float* part_w = partials + static_cast<int64_t>(blockIdx.x) * 3 * D;
  float* part_r = part_w + D;
  float* part_o = part_r + D;
  for (int64_t j = threadIdx.x; j < 3 * D; j += kAttnResThreads) part_w[j] = 0.0f;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * launch::kAttnResTokenBlock;
  const int64_t t1 = t0 + launch::kAttnResTokenBlock < N ? t0 + launch::kAttnResTokenBlock : N;
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t i = 0; i < S; ++i) {
      const float* v = src + (i * N + t) * D;
      float ss = 0.0f;
      for (int64_t j = threadIdx.x; j < D; j += kAttnResThreads) ss += v[j] * v[j];
      const float inv_i = 1.0f / sqrtf(dev::block_sum(ss, red) / fd + eps);
      float dot = 0.0f;
      for (int64_t j = threadIdx.x; j < D; j += kAttnResThreads)
        dot += (v[j] * inv_i) * r[j] * w[j];
      dot = dev::block_sum(dot, red);
      if (threadIdx.x == 0) {
        logit[i] = dot;
        inv[i] = inv_i;
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {  // the softmax over depth, in the CPU's order
      float mx = -INFINITY;
      for (int64_t i = 0; i < S; ++i) mx = fmaxf(mx, logit[i]);
      float z = 0.0f;
      for (int64_t i = 0; i < S; ++i) z += (p[i] = expf(logit[i] - mx));
      for (int64_t i = 0; i < S; ++i) p[i] /= z;
    }
    __syncthreads();
    float ss = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += kAttnResThreads) {
      float m = 0.0f;
      for (int64_t i = 0; i < S; ++i) m += p[i] * src[(i * N + t) * D + j];
      mix[j] = m;
      ss += m * m;
    }
    const float inv_m = 1.0f / sqrtf(dev::block_sum(ss, red) / fd + eps);
    const float* g = gout + t * D;
    float gm = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += kAttnResThreads) {
      const float mhat = mix[j] * inv_m;
      part_o[j] += g[j] * mhat;
      gm += g[j] * o[j] * mhat;
    }
    gm = dev::block_sum(gm, red);
    for (int64_t j = threadIdx.x; j < D; j += kAttnResThreads)
      dm[j] = inv_m * (g[j] * o[j] - mix[j] * inv_m * (gm / fd));
    for (int64_t i = 0; i < S; ++i) {
      const float* v = src + (i * N + t) * D;
      float dot = 0.0f;
      for (int64_t j = threadIdx.x; j < D; j += kAttnResThreads) dot += dm[j] * v[j];
      dot = dev::block_sum(dot, red);
      if (threadIdx.x == 0) dp[i] = dot;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float pdp = 0.0f;
      for (int64_t i = 0; i < S; ++i) pdp += p[i] * dp[i];
      pdp_s = pdp;
    }
    __syncthreads();
    const float pdp = pdp_s;
    // Every read of this token's sources is behind a barrier now: each thread rewrites only
    // the elements it reads (dsources may alias sources).
    for (int64_t j = threadIdx.x; j < D; j += kAttnResThreads) du[j] = 0.0f;
    for (int64_t i = 0; i < S; ++i) {
      const float ds = p[i] * (dp[i] - pdp);
      const float* v = src + (i * N + t) * D;
      float* dv = dsrc + (i * N + t) * D;
      const float k = logit[i] * inv[i] / fd;
      for (int64_t j = threadIdx.x; j < D; j += kAttnResThreads) {
        const float vj = v[j];
        du[j] += ds * (vj * inv[i]);
        dv[j] = p[i] * dm[j] + ds * inv[i] * (r[j] * w[j] - k * vj);
      }
    }
    for (int64_t j = threadIdx.x; j < D; j += kAttnResThreads) {
      part_w[j] += du[j] * r[j];
      part_r[j] += du[j] * w[j];
    }
    __syncthreads();  // the shared rows are rewritten by the next token
  }
}

// The same per-token work with a warp per token (warp reductions, no block barriers): for widths
// whose per-warp rows fit shared memory (attnres_warp_smem). Block = kAttnResWarps warps over the
// same 16 tokens as the block form (warp w takes tokens t0 + w, t0 + w + kAttnResWarps, ...), each
// warp summing its tokens' parameter terms in its own rows, the block adding the warps' rows in
// warp order into its partial. Per warp: mix, dm, du, pw, pr, po [D]; logit, inv, p, dp [S].
constexpr int kAttnResWarps = 4;

__host__ __device__ inline int64_t attnres_warp_floats(int64_t S, int64_t D) {
  return 6 * D + 4 * S;
}

__global__ void __launch_bounds__(kAttnResWarps * 32)
    attnres_backward_warp_kernel(const float* src, const float* __restrict__ w,
                                 const float* __restrict__ r, const float* __restrict__ o,
                                 float eps, const float* __restrict__ gout, int64_t S, int64_t N,
                                 int64_t D, float* dsrc, float* __restrict__ partials) {
  extern __shared__ float sh[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* mix = sh + warp * attnres_warp_floats(S, D);
  float* dm = mix + D;
  float* du = dm + D;
  float* pw = du + D;
  float* pr = pw + D;
  float* po = pr + D;
  float* logit = po + D;
  float* inv = logit + S;
  float* p = inv + S;
  float* dp = p + S;
  const float fd = static_cast<float>(D);
  for (int64_t j = lane; j < 3 * D; j += 32) pw[j] = 0.0f;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * launch::kAttnResTokenBlock;
  const int64_t t1 = t0 + launch::kAttnResTokenBlock < N ? t0 + launch::kAttnResTokenBlock : N;
  for (int64_t t = t0 + warp; t < t1; t += kAttnResWarps) {
    for (int64_t i = 0; i < S; ++i) {
      const float* v = src + (i * N + t) * D;
      float ss = 0.0f;
      for (int64_t j = lane; j < D; j += 32) ss += v[j] * v[j];
      const float inv_i = 1.0f / sqrtf(dev::warp_sum(ss) / fd + eps);
      float dot = 0.0f;
      for (int64_t j = lane; j < D; j += 32) dot += (v[j] * inv_i) * r[j] * w[j];
      dot = dev::warp_sum(dot);  // on every lane
      if (lane == 0) {
        logit[i] = dot;
        inv[i] = inv_i;
      }
    }
    __syncwarp();
    float mx = -INFINITY;  // the softmax over depth in the CPU's order, on every lane
    for (int64_t i = 0; i < S; ++i) mx = fmaxf(mx, logit[i]);
    float z = 0.0f;
    for (int64_t i = 0; i < S; ++i) z += expf(logit[i] - mx);
    for (int64_t i = lane; i < S; i += 32) p[i] = expf(logit[i] - mx) / z;
    __syncwarp();
    float ss = 0.0f;
    for (int64_t j = lane; j < D; j += 32) {
      float m = 0.0f;
      for (int64_t i = 0; i < S; ++i) m += p[i] * src[(i * N + t) * D + j];
      mix[j] = m;
      ss += m * m;
    }
    const float inv_m = 1.0f / sqrtf(dev::warp_sum(ss) / fd + eps);
    const float* g = gout + t * D;
    float gm = 0.0f;
    for (int64_t j = lane; j < D; j += 32) {
      const float mhat = mix[j] * inv_m;
      po[j] += g[j] * mhat;
      gm += g[j] * o[j] * mhat;
    }
    gm = dev::warp_sum(gm);
    for (int64_t j = lane; j < D; j += 32)
      dm[j] = inv_m * (g[j] * o[j] - mix[j] * inv_m * (gm / fd));
    __syncwarp();
    float pdp = 0.0f;
    for (int64_t i = 0; i < S; ++i) {
      const float* v = src + (i * N + t) * D;
      float dot = 0.0f;
      for (int64_t j = lane; j < D; j += 32) dot += dm[j] * v[j];
      dot = dev::warp_sum(dot);
      if (lane == 0) dp[i] = dot;
      pdp += p[i] * dot;
    }
    __syncwarp();
    // This warp alone reads this token's sources, all of them before here (dot products above
    // end in shuffles every lane waits for): each lane rewrites only the elements it reads
    // (dsources may alias sources).
    for (int64_t j = lane; j < D; j += 32) du[j] = 0.0f;
    for (int64_t i = 0; i < S; ++i) {
      const float ds = p[i] * (dp[i] - pdp);
      const float* v = src + (i * N + t) * D;
      float* dv = dsrc + (i * N + t) * D;
      const float k = logit[i] * inv[i] / fd;
      for (int64_t j = lane; j < D; j += 32) {
        const float vj = v[j];
        du[j] += ds * (vj * inv[i]);
        dv[j] = p[i] * dm[j] + ds * inv[i] * (r[j] * w[j] - k * vj);
      }
    }
    for (int64_t j = lane; j < D; j += 32) {
      pw[j] += du[j] * r[j];
      pr[j] += du[j] * w[j];
    }
    __syncwarp();  // the warp's rows are rewritten by its next token
  }
  __syncthreads();
  float* part = partials + static_cast<int64_t>(blockIdx.x) * 3 * D;
  for (int64_t j = threadIdx.x; j < 3 * D; j += kAttnResWarps * 32) {
    float acc = 0.0f;
    for (int wi = 0; wi < kAttnResWarps; ++wi)
      acc += sh[wi * attnres_warp_floats(S, D) + 3 * D + j];
    part[j] = acc;
  }
}

// Shared bytes of the warp form; it runs when they stay within this bound (D up to about 1000),
// leaving room for two blocks an SM.
constexpr size_t kAttnResWarpSmemMax = 100 * 1024;
size_t attnres_warp_smem(int64_t S, int64_t D) {
  return static_cast<size_t>(kAttnResWarps * attnres_warp_floats(S, D)) * sizeof(float);
}

}  // namespace

namespace launch {
void attnres_backward(cudaStream_t stream, const float* sources, const float* query,
                      const float* key_norm, const float* out_norm, float eps, const float* dout,
                      int64_t S, int64_t N, int64_t D, float* dsources, float* partials,
                      float* dquery, float* dkey_norm, float* dout_norm) {
  if (N == 0 || D == 0) return;
  const int64_t blocks = (N + kAttnResTokenBlock - 1) / kAttnResTokenBlock;
  if (const size_t warp_smem = attnres_warp_smem(S, D); warp_smem <= kAttnResWarpSmemMax) {
    // Raises the kernel's shared-memory limit on this device (once per size; cached).
    if (warp_smem > 48 * 1024)
      resident_blocks(reinterpret_cast<const void*>(&attnres_backward_warp_kernel),
                      kAttnResWarps * 32, warp_smem);
    attnres_backward_warp_kernel<<<blocks_of(blocks, 1), kAttnResWarps * 32, warp_smem, stream>>>(
        sources, query, key_norm, out_norm, eps, dout, S, N, D, dsources, partials);
    LOOM_CUDA_CHECK_LAUNCH();
    ordered_column_total(stream, partials, blocks, 3 * D, D, dquery, dkey_norm, dout_norm);
    return;
  }
  const size_t smem = static_cast<size_t>(3 * D + 4 * S) * sizeof(float);
  if (smem > 48 * 1024) {
    LOOM_CUDA_CHECK(cudaFuncSetAttribute(attnres_backward_kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem)));
  }
  attnres_backward_kernel<<<blocks_of(blocks, 1), kAttnResThreads, smem, stream>>>(
      sources, query, key_norm, out_norm, eps, dout, S, N, D, dsources, partials);
  LOOM_CUDA_CHECK_LAUNCH();
  ordered_column_total(stream, partials, blocks, 3 * D, D, dquery, dkey_norm, dout_norm);
}
}  // namespace launch
}  // namespace loom::cuda

// ---- causal attention for training ----------------------------------------------------------
namespace loom::cuda {
namespace {

constexpr int kAttnThreads = 128;
constexpr int kAttnWarps = kAttnThreads / 32;
constexpr int kAttnTile = 64;  // queries per step of the dk/dv pass
constexpr int kAttnPerThread = launch::kAttnMaxHeadDim / kAttnThreads;

__device__ __forceinline__ float warp_dot(const float* a, const float* b, int64_t n, int lane) {
  float s = 0.0f;
  for (int64_t c = lane; c < n; c += 32) s += a[c] * b[c];
  return dev::warp_sum(s);
}

__device__ __forceinline__ float block_max(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = lane < kAttnWarps ? red[lane] : -INFINITY;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__global__ void __launch_bounds__(kAttnThreads)
    attn_train_fwd_kernel(const float* __restrict__ q, const float* __restrict__ k,
                          const float* __restrict__ v, float scale, const int64_t* cu, int64_t nseq,
                          int64_t T, int64_t Hq, int64_t Hkv, int64_t d, int64_t dv,
                          float* __restrict__ out, float* __restrict__ lse) {
  extern __shared__ float s[];  // s[j - b]: the score of key j
  __shared__ float red[32];
  const int64_t i = blockIdx.x, h = blockIdx.y, hk = h / (Hq / Hkv);
  const int64_t b = row_seq(cu, nseq, T, i).begin;  // query i attends keys b .. i
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float* qi = q + (i * Hq + h) * d;
  for (int64_t j = b + warp; j <= i; j += kAttnWarps) {
    const float dot = warp_dot(qi, k + (j * Hkv + hk) * d, d, lane);
    if (lane == 0) s[j - b] = scale * dot;
  }
  __syncthreads();
  float m = -INFINITY;
  for (int64_t j = b + threadIdx.x; j <= i; j += kAttnThreads) m = fmaxf(m, s[j - b]);
  m = block_max(m, red);
  float z = 0.0f;
  for (int64_t j = b + threadIdx.x; j <= i; j += kAttnThreads) z += (s[j - b] = expf(s[j - b] - m));
  z = dev::block_sum(z, red);
  for (int64_t c = threadIdx.x; c < dv; c += kAttnThreads) {
    float acc = 0.0f;
    for (int64_t j = b; j <= i; ++j) acc += s[j - b] / z * v[(j * Hkv + hk) * dv + c];
    out[(i * Hq + h) * dv + c] = acc;
  }
  if (threadIdx.x == 0) lse[i * Hq + h] = m + logf(z);
}

// dq of (query i, head h) and D_i = dO_i . O_i (kept for the dk/dv pass).
__global__ void __launch_bounds__(kAttnThreads)
    attn_train_dq_kernel(const float* __restrict__ q, const float* __restrict__ k,
                         const float* __restrict__ v, const float* __restrict__ out,
                         const float* __restrict__ lse, const float* __restrict__ d_out,
                         float scale, const int64_t* cu, int64_t nseq, int64_t T, int64_t Hq,
                         int64_t Hkv, int64_t d, int64_t dv, float* __restrict__ d_rows,
                         float* __restrict__ dq) {
  extern __shared__ float ds[];  // ds[j - b]
  __shared__ float red[32];
  const int64_t i = blockIdx.x, h = blockIdx.y, hk = h / (Hq / Hkv);
  const int64_t b = row_seq(cu, nseq, T, i).begin;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float* qi = q + (i * Hq + h) * d;
  const float* doi = d_out + (i * Hq + h) * dv;
  float part = 0.0f;
  for (int64_t c = threadIdx.x; c < dv; c += kAttnThreads)
    part += doi[c] * out[(i * Hq + h) * dv + c];
  const float D = dev::block_sum(part, red);
  const float l = lse[i * Hq + h];
  for (int64_t j = b + warp; j <= i; j += kAttnWarps) {
    const float sdot = warp_dot(qi, k + (j * Hkv + hk) * d, d, lane);
    const float vdot = warp_dot(doi, v + (j * Hkv + hk) * dv, dv, lane);
    if (lane == 0) {
      const float p = expf(scale * sdot - l);
      ds[j - b] = p * (vdot - D) * scale;
    }
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < d; c += kAttnThreads) {
    float acc = 0.0f;
    for (int64_t j = b; j <= i; ++j) acc += ds[j - b] * k[(j * Hkv + hk) * d + c];
    dq[(i * Hq + h) * d + c] = acc;
  }
  if (threadIdx.x == 0) d_rows[i * Hq + h] = D;
}

// dk, dv of (key j, kv head hk): the query heads of hk in order, queries i >= j ascending.
__global__ void __launch_bounds__(kAttnThreads)
    attn_train_dkv_kernel(const float* __restrict__ q, const float* __restrict__ k,
                          const float* __restrict__ v, const float* __restrict__ lse,
                          const float* __restrict__ d_out, const float* __restrict__ d_rows,
                          float scale, const int64_t* cu, int64_t nseq, int64_t T, int64_t Hq,
                          int64_t Hkv, int64_t d, int64_t dv, float* __restrict__ dk,
                          float* __restrict__ dvv) {
  __shared__ float pb[kAttnTile], dsb[kAttnTile];
  const int64_t j = blockIdx.x, hk = blockIdx.y, group = Hq / Hkv;
  const int64_t e = row_seq(cu, nseq, T, j).end;  // key j is seen by queries j .. e - 1
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float* kj = k + (j * Hkv + hk) * d;
  const float* vj = v + (j * Hkv + hk) * dv;
  float dk_acc[kAttnPerThread], dv_acc[kAttnPerThread];
#pragma unroll
  for (int e = 0; e < kAttnPerThread; ++e) dk_acc[e] = dv_acc[e] = 0.0f;
  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
    for (int64_t i0 = j; i0 < e; i0 += kAttnTile) {
      const int64_t n = e - i0 < kAttnTile ? e - i0 : kAttnTile;
      for (int64_t x = warp; x < n; x += kAttnWarps) {
        const int64_t i = i0 + x;
        const float sdot = warp_dot(q + (i * Hq + h) * d, kj, d, lane);
        const float vdot = warp_dot(d_out + (i * Hq + h) * dv, vj, dv, lane);
        if (lane == 0) {
          const float p = expf(scale * sdot - lse[i * Hq + h]);
          pb[x] = p;
          dsb[x] = p * (vdot - d_rows[i * Hq + h]) * scale;
        }
      }
      __syncthreads();
      for (int64_t x = 0; x < n; ++x) {
        const int64_t i = i0 + x;
        const float* qi = q + (i * Hq + h) * d;
        const float* doi = d_out + (i * Hq + h) * dv;
#pragma unroll
        for (int e = 0; e < kAttnPerThread; ++e) {
          const int64_t c = threadIdx.x + e * kAttnThreads;
          if (c < d) dk_acc[e] += dsb[x] * qi[c];
          if (c < dv) dv_acc[e] += pb[x] * doi[c];
        }
      }
      __syncthreads();
    }
  }
#pragma unroll
  for (int e = 0; e < kAttnPerThread; ++e) {
    const int64_t c = threadIdx.x + e * kAttnThreads;
    if (c < d) dk[(j * Hkv + hk) * d + c] = dk_acc[e];
    if (c < dv) dvv[(j * Hkv + hk) * dv + c] = dv_acc[e];
  }
}

// One score per key, plus 4 floats of slack: ptxas merges the tail of the `j <= i` loops over the
// scores into one vector load that reaches up to 3 floats past the last score (compute-sanitizer
// memcheck flagged it at T = 70); the values past it are never used.
size_t scores_smem_bytes(int64_t T) { return static_cast<size_t>(T + 4) * sizeof(float); }

void set_scores_smem(const void* kernel, size_t bytes) {
  if (bytes > 48 * 1024) {
    LOOM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(bytes)));
  }
}

}  // namespace

namespace launch {
void causal_attention_forward(cudaStream_t stream, const float* q, const float* k, const float* v,
                              float scale, int64_t T, int64_t Hq, int64_t Hkv, int64_t d,
                              int64_t dv, float* out, float* lse, const int64_t* cu, int64_t nseq,
                              int64_t max_T) {
  if (T == 0 || Hq == 0) return;
  if (attention_tiled_supported(d, dv)) {
    causal_attention_tiled_forward(stream, q, k, v, scale, T, Hq, Hkv, d, dv, out, lse, cu, nseq,
                                   max_T);
    return;
  }
  check_y(Hq, "causal_attention_forward");
  const size_t smem = scores_smem_bytes(cu != nullptr ? max_T : T);
  set_scores_smem(reinterpret_cast<const void*>(attn_train_fwd_kernel), smem);
  const dim3 grid(blocks_of(T, 1), static_cast<unsigned>(Hq));
  attn_train_fwd_kernel<<<grid, kAttnThreads, smem, stream>>>(q, k, v, scale, cu, nseq, T, Hq, Hkv,
                                                              d, dv, out, lse);
  LOOM_CUDA_CHECK_LAUNCH();
}

void causal_attention_backward(cudaStream_t stream, const float* q, const float* k, const float* v,
                               const float* out, const float* lse, const float* d_out, float scale,
                               int64_t T, int64_t Hq, int64_t Hkv, int64_t d, int64_t dv,
                               float* d_rows, float* dq, float* dk, float* dvv, const int64_t* cu,
                               int64_t nseq, int64_t max_T) {
  if (T == 0 || Hq == 0) return;
  if (attention_tiled_supported(d, dv)) {
    causal_attention_tiled_backward(stream, q, k, v, out, lse, d_out, scale, T, Hq, Hkv, d, dv,
                                    d_rows, dq, dk, dvv, cu, nseq, max_T);
    return;
  }
  check_y(Hq, "causal_attention_backward");
  const size_t smem = scores_smem_bytes(cu != nullptr ? max_T : T);
  set_scores_smem(reinterpret_cast<const void*>(attn_train_dq_kernel), smem);
  attn_train_dq_kernel<<<dim3(blocks_of(T, 1), static_cast<unsigned>(Hq)), kAttnThreads, smem,
                         stream>>>(q, k, v, out, lse, d_out, scale, cu, nseq, T, Hq, Hkv, d, dv,
                                   d_rows, dq);
  LOOM_CUDA_CHECK_LAUNCH();
  attn_train_dkv_kernel<<<dim3(blocks_of(T, 1), static_cast<unsigned>(Hkv)), kAttnThreads, 0,
                          stream>>>(q, k, v, lse, d_out, d_rows, scale, cu, nseq, T, Hq, Hkv, d, dv,
                                    dk, dvv);
  LOOM_CUDA_CHECK_LAUNCH();
}
}  // namespace launch
}  // namespace loom::cuda

// ---- moe_aux_loss_forward_backward ----------------------------------------------------------
namespace loom::cuda {
namespace {

__global__ void __launch_bounds__(kPointThreads)
    moe_aux_rows_kernel(const float* __restrict__ logits, int64_t T, int64_t E, bool sigmoid,
                        const float* __restrict__ c, float* __restrict__ p_buf,
                        float* __restrict__ s_buf, float* __restrict__ d_logits) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kPointThreads + threadIdx.x;
  if (i >= T) return;
  const float* l = logits + i * E;
  float* p = p_buf + i * E;
  float* s = s_buf + i * E;
  float inv = 1.0f;
  if (sigmoid) {
    float sum = 0.0f;
    for (int64_t j = 0; j < E; ++j) sum += (s[j] = 1.0f / (1.0f + expf(-l[j])));
    inv = 1.0f / sum;
    for (int64_t j = 0; j < E; ++j) p[j] = s[j] * inv;
  } else {
    float mx = -INFINITY;
    for (int64_t j = 0; j < E; ++j) mx = fmaxf(mx, l[j]);
    float sum = 0.0f;
    for (int64_t j = 0; j < E; ++j) sum += (p[j] = expf(l[j] - mx));
    for (int64_t j = 0; j < E; ++j) p[j] /= sum;
  }
  float dot = 0.0f;
  for (int64_t j = 0; j < E; ++j) dot += p[j] * c[j];
  float* dl = d_logits + i * E;
  for (int64_t j = 0; j < E; ++j) {
    const float g =
        sigmoid ? (c[j] - dot) * inv * (s[j] * (1.0f / (1.0f + expf(l[j])))) : p[j] * (c[j] - dot);
    dl[j] = __fadd_rn(dl[j], g);  // a finished gradient added, as the CPU does (no FMA)
  }
}

__global__ void __launch_bounds__(kColThreads)
    moe_aux_mass_kernel(const float* __restrict__ p_buf, int64_t T, int64_t E,
                        double* __restrict__ mass) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * kColThreads + threadIdx.x;
  if (e >= E) return;
  double m = 0.0;
  for (int64_t t = 0; t < T; ++t) m += p_buf[t * E + e];
  mass[e] = m;
}

__global__ void moe_aux_loss_kernel(const double* __restrict__ coef,
                                    const double* __restrict__ mass, int64_t E,
                                    float* __restrict__ loss) {
  double sum = 0.0;
  for (int64_t e = 0; e < E; ++e) sum += coef[e] * mass[e];
  *loss = static_cast<float>(sum);
}

}  // namespace

namespace launch {
void moe_aux_loss(cudaStream_t stream, const float* logits, int64_t T, int64_t E, bool sigmoid,
                  const float* c, const double* coef, float* p_buf, float* s_buf, double* mass,
                  float* loss, float* d_logits) {
  if (T > 0) {
    moe_aux_rows_kernel<<<blocks_of(T, kPointThreads), kPointThreads, 0, stream>>>(
        logits, T, E, sigmoid, c, p_buf, s_buf, d_logits);
    LOOM_CUDA_CHECK_LAUNCH();
    moe_aux_mass_kernel<<<blocks_of(E, kColThreads), kColThreads, 0, stream>>>(p_buf, T, E, mass);
    LOOM_CUDA_CHECK_LAUNCH();
  }
  moe_aux_loss_kernel<<<1, 1, 0, stream>>>(coef, mass, T > 0 ? E : 0, loss);
  LOOM_CUDA_CHECK_LAUNCH();
}
}  // namespace launch
}  // namespace loom::cuda

// ---- kda_recurrent_backward -----------------------------------------------------------------
namespace loom::cuda {
namespace {

using launch::KdaBackwardArgs;
constexpr int64_t kKdaSeg = 64;  // kKdaBackwardSegment (kernels/kda_backward.h)

struct KdaHeadScratch {
  float *ckpt, *pre, *S, *Sp, *dS, *dq_h, *dk_h;
};

__device__ __forceinline__ KdaHeadScratch kda_head_scratch(const KdaBackwardArgs& a, int64_t h) {
  const int64_t area = a.dk * a.dv, segments = a.T > 0 ? (a.T + kKdaSeg - 1) / kKdaSeg : 1;
  const int64_t per_head = (segments + kKdaSeg + 3) * area;
  KdaHeadScratch s;
  s.ckpt = a.scratch + h * per_head;
  s.pre = s.ckpt + segments * area;
  s.S = s.pre + kKdaSeg * area;
  s.Sp = s.S + area;
  s.dS = s.Sp + area;
  float* shares = a.scratch + a.Hv * per_head;
  s.dq_h = shares + h * a.T * a.dk;
  s.dk_h = shares + a.Hv * a.T * a.dk + h * a.T * a.dk;
  return s;
}

// One forward token on S (column j by thread j): S = diag(e) S, kv = S^T k, S += k b (v - kv)^T.
// A correctness-first form (one block a head, the state in global memory, the time loop serial):
// the chunked backward on tensor cores is the fast path still to come.
__device__ void kda_bw_forward_token(const KdaBackwardArgs& a, float* S, const float* kt,
                                     const float* vt, const float* gt, float bt) {
  const int64_t j = threadIdx.x;
  if (j < a.dv) {
    float kv = 0.0f;
    for (int64_t i = 0; i < a.dk; ++i) {
      const float e = expf(gt[a.scalar_g ? 0 : i]);
      float& s = S[i * a.dv + j];
      s *= e;
      kv += kt[i] * s;
    }
    const float diff = vt[j] - kv;
    for (int64_t i = 0; i < a.dk; ++i) S[i * a.dv + j] += kt[i] * bt * diff;  // the CPU's order
  }
}

__global__ void kda_backward_head_kernel(KdaBackwardArgs a) {
  extern __shared__ float sm[];
  const int64_t h = blockIdx.x, hk = h / (a.Hv / a.Hk);
  const int64_t dk = a.dk, dv = a.dv, area = dk * dv, gw = a.scalar_g ? 1 : dk;
  const int64_t x = threadIdx.x;
  float* e = sm;           // [dk]
  float* kv = e + dk;      // [dv]
  float* u = kv + dv;      // [dv]
  float* du = u + dv;      // [dv]
  float* dkv = du + dv;    // [dv]
  float* accg = dkv + dv;  // [dk]
  const KdaHeadScratch s = kda_head_scratch(a, h);
  auto qt = [&](int64_t t) { return a.q + (t * a.Hk + hk) * dk; };
  auto kt = [&](int64_t t) { return a.k + (t * a.Hk + hk) * dk; };
  auto vt = [&](int64_t t) { return a.v + (t * a.Hv + h) * dv; };
  auto gt = [&](int64_t t) { return a.g + (t * a.Hv + h) * gw; };
  auto bt = [&](int64_t t) { return a.beta[t * a.Hv + h]; };
  const int64_t segments = a.T > 0 ? (a.T + kKdaSeg - 1) / kKdaSeg : 1;
  // Checkpoints: the state before tokens 0, seg, 2 seg, ... (column j by thread j throughout the
  // forward sweeps, so no barrier is needed between them).
  for (int64_t idx = x; idx < area; idx += blockDim.x) s.S[idx] = a.s0[h * area + idx];
  __syncthreads();
  for (int64_t t = 0; t < a.T; ++t) {
    if (t % kKdaSeg == 0 && x < dv)
      for (int64_t i = 0; i < dk; ++i) s.ckpt[(t / kKdaSeg) * area + i * dv + x] = s.S[i * dv + x];
    kda_bw_forward_token(a, s.S, kt(t), vt(t), gt(t), bt(t));
  }
  __syncthreads();
  for (int64_t idx = x; idx < area; idx += blockDim.x)
    s.dS[idx] = a.d_final != nullptr ? a.d_final[h * area + idx] : 0.0f;
  __syncthreads();
  for (int64_t c = segments - 1; c >= 0; --c) {
    const int64_t t0 = c * kKdaSeg, t1 = t0 + kKdaSeg < a.T ? t0 + kKdaSeg : a.T;
    if (x < dv) {  // replay the segment (column x), keeping the state before each token
      for (int64_t i = 0; i < dk; ++i) s.S[i * dv + x] = s.ckpt[c * area + i * dv + x];
      for (int64_t t = t0; t < t1; ++t) {
        for (int64_t i = 0; i < dk; ++i) s.pre[(t - t0) * area + i * dv + x] = s.S[i * dv + x];
        kda_bw_forward_token(a, s.S, kt(t), vt(t), gt(t), bt(t));
      }
    }
    __syncthreads();
    for (int64_t t = t1 - 1; t >= t0; --t) {
      const float* P = s.pre + (t - t0) * area;
      const float* qv = qt(t);
      const float* kvec = kt(t);
      const float* vv = vt(t);
      const float* gv = gt(t);
      const float b = bt(t);
      const float* dO = a.d_out + (t * a.Hv + h) * dv;
      if (x < dk) e[x] = expf(gv[a.scalar_g ? 0 : x]);
      __syncthreads();
      // 1. S' = diag(e) P, kv = S'^T k, u = b (v - kv): columns.
      if (x < dv) {
        float acc = 0.0f;
        for (int64_t i = 0; i < dk; ++i) {
          const float sp = e[i] * P[i * dv + x];
          s.Sp[i * dv + x] = sp;
          acc += kvec[i] * sp;
        }
        kv[x] = acc;
        u[x] = b * (vv[x] - acc);
      }
      __syncthreads();
      // 2. o = S_t^T (scale q): dq and the output's share of dS: rows.
      if (x < dk) {
        float acc = 0.0f;
        const float qi = a.scale * qv[x];
        for (int64_t j = 0; j < dv; ++j) {
          acc += (s.Sp[x * dv + j] + kvec[x] * u[j]) * dO[j];
          s.dS[x * dv + j] += qi * dO[j];
        }
        s.dq_h[t * dk + x] = a.scale * acc;
      }
      __syncthreads();
      // 3. S_t = S' + k u^T: dk (rows) and du (columns).
      if (x < dk) {
        float acc = 0.0f;
        for (int64_t j = 0; j < dv; ++j) acc += s.dS[x * dv + j] * u[j];
        s.dk_h[t * dk + x] = acc;
      }
      if (x < dv) {
        float acc = 0.0f;
        for (int64_t i = 0; i < dk; ++i) acc += kvec[i] * s.dS[i * dv + x];
        du[x] = acc;
      }
      __syncthreads();
      // 4. u = b (v - kv).
      if (x < dv) {
        a.dv_out[(t * a.Hv + h) * dv + x] = b * du[x];
        dkv[x] = -b * du[x];
      }
      if (x == 0) {
        float db = 0.0f;
        for (int64_t j = 0; j < dv; ++j) db += du[j] * (vv[j] - kv[j]);
        a.dbeta[t * a.Hv + h] = db;
      }
      __syncthreads();
      // 5. kv = S'^T k and S' = diag(e) P: rows.
      if (x < dk) {
        float acc_k = 0.0f, acc_g = 0.0f;
        for (int64_t j = 0; j < dv; ++j) {
          const float sp = s.Sp[x * dv + j];
          acc_k += sp * dkv[j];
          const float dsp = s.dS[x * dv + j] + kvec[x] * dkv[j];
          acc_g += sp * dsp;
          s.dS[x * dv + j] = e[x] * dsp;
        }
        s.dk_h[t * dk + x] += acc_k;
        if (a.scalar_g) {
          accg[x] = acc_g;
        } else {
          a.dg[(t * a.Hv + h) * gw + x] = acc_g;
        }
      }
      __syncthreads();
      if (a.scalar_g && x == 0) {
        float sum = 0.0f;
        for (int64_t i = 0; i < dk; ++i) sum += accg[i];
        a.dg[t * a.Hv + h] = sum;
      }
      __syncthreads();
    }
  }
  if (a.d_s0 != nullptr)
    for (int64_t idx = x; idx < area; idx += blockDim.x) a.d_s0[h * area + idx] = s.dS[idx];
}

// dq, dk [T, Hk, dk]: the value heads' shares summed per key head in head order.
__global__ void __launch_bounds__(kPointThreads) kda_backward_sum_heads_kernel(KdaBackwardArgs a) {
  const int64_t n = a.T * a.Hk * a.dk, group = a.Hv / a.Hk;
  const float* shares =
      a.scratch +
      a.Hv * ((a.T > 0 ? (a.T + kKdaSeg - 1) / kKdaSeg : 1) + kKdaSeg + 3) * a.dk * a.dv;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * kPointThreads + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * kPointThreads) {
    const int64_t i = idx % a.dk, hk = (idx / a.dk) % a.Hk, t = idx / (a.dk * a.Hk);
    float sq = 0.0f, sk = 0.0f;
    for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
      sq += shares[(h * a.T + t) * a.dk + i];
      sk += shares[a.Hv * a.T * a.dk + (h * a.T + t) * a.dk + i];
    }
    a.dq[idx] = sq;
    a.dk_out[idx] = sk;
  }
}

}  // namespace

namespace launch {
int64_t kda_backward_scratch_floats(int64_t T, int64_t Hv, int64_t dk, int64_t dv) {
  const int64_t segments = T > 0 ? (T + kKdaSeg - 1) / kKdaSeg : 1;
  return Hv * (segments + kKdaSeg + 3) * dk * dv + 2 * Hv * T * dk;
}

void kda_recurrent_backward(cudaStream_t stream, const KdaBackwardArgs& a) {
  if (a.Hv == 0) return;
  const int64_t width = a.dk > a.dv ? a.dk : a.dv;
  const int threads = static_cast<int>((width + 31) / 32 * 32);
  const size_t smem = static_cast<size_t>(2 * a.dk + 4 * a.dv) * sizeof(float);
  kda_backward_head_kernel<<<blocks_of(a.Hv, 1), threads, smem, stream>>>(a);
  LOOM_CUDA_CHECK_LAUNCH();
  const int64_t n = a.T * a.Hk * a.dk;
  if (n > 0) {
    kda_backward_sum_heads_kernel<<<dev::grid_for(n, kPointThreads), kPointThreads, 0, stream>>>(a);
    LOOM_CUDA_CHECK_LAUNCH();
  }
}
}  // namespace launch
}  // namespace loom::cuda
