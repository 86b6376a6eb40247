// KDA / Gated DeltaNet on CUDA: the decay gate (elementwise) and the token-by-token recurrence.
//
// Recurrence layout. Column j of a head's state S[:, j] evolves independently of the other
// columns (kv_j = k.S[:, j], u_j = beta (v_j - kv_j), S[:, j] += k u_j, o_j = q.S[:, j]), so the
// grid is (value head, tile of 32 value columns). A block is 32 x 8 threads: lane x owns column
// j0 + x, and row group y owns rows i = y, y + 8, y + 16, ... of that column, held in registers
// (at most dk / 8 = 32 floats a thread for dk = 256). The two dot products over i are per-thread
// partial sums reduced across the 8 row groups through shared memory. Per token the block stages
// k, scale * q, exp(g) and the v tile in shared memory (double-buffered), so three barriers a
// token suffice. State is read once at the start and written once at the end.
#include "kernels/cuda/bf16_io.cuh"

namespace loom::cuda {
namespace {

constexpr int kCols = 32;      // value columns per block (one warp wide: coalesced state rows)
constexpr int kRowGroups = 8;  // warps per block
constexpr int kMaxDk = 256;

// Blocks per SM the register budget is capped for: 4 (64 registers) while the state slice is at
// most 16 floats a thread (ptxas -v: 64 registers and an 8-byte spill for
// dk in (64, 128]), 2 for dk > 128 (32 floats, 128 registers, no spill).
template <int kMaxI>
__global__ void __launch_bounds__(kCols* kRowGroups, kMaxI <= 16 ? 4 : 2)
    kda_recurrent_kernel(const float* __restrict__ q, const float* __restrict__ k,
                         const float* __restrict__ v, const float* __restrict__ g,
                         const float* __restrict__ beta, float scale, float* __restrict__ state,
                         float* __restrict__ out, int T, int Hk, int Hv, int dk, int dv,
                         bool scalar_g) {
  __shared__ float ks[2][kMaxDk], qs[2][kMaxDk], es[2][kMaxDk];
  __shared__ float vs[2][kCols], bs[2];
  __shared__ float red1[kRowGroups][kCols], red2[kRowGroups][kCols];

  const int h = blockIdx.x;
  const int hk = h / (Hv / Hk);
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int tid = ty * kCols + tx;
  const int col = blockIdx.y * kCols + tx;
  const bool col_ok = col < dv;
  float* S_g = state + static_cast<int64_t>(h) * dk * dv;

  float S[kMaxI];
#pragma unroll
  for (int ii = 0; ii < kMaxI; ++ii) {
    const int i = ty + ii * kRowGroups;
    S[ii] = (i < dk && col_ok) ? S_g[static_cast<int64_t>(i) * dv + col] : 0.0f;
  }

  for (int t = 0; t < T; ++t) {
    const int buf = t & 1;
    const int64_t kq_off = (static_cast<int64_t>(t) * Hk + hk) * dk;
    const int64_t hv_row = static_cast<int64_t>(t) * Hv + h;
    for (int i = tid; i < dk; i += kCols * kRowGroups) {
      ks[buf][i] = k[kq_off + i];
      qs[buf][i] = q[kq_off + i] * scale;
      es[buf][i] = expf(scalar_g ? g[hv_row] : g[hv_row * dk + i]);
    }
    if (tid < kCols) {
      const int c = blockIdx.y * kCols + tid;
      vs[buf][tid] = c < dv ? v[hv_row * dv + c] : 0.0f;
    }
    if (tid == 0) bs[buf] = beta[hv_row];
    __syncthreads();

    // Decay, then partial S^T k.
    float part = 0.0f;
#pragma unroll
    for (int ii = 0; ii < kMaxI; ++ii) {
      const int i = ty + ii * kRowGroups;
      if (i < dk) {
        const float s = S[ii] * es[buf][i];
        S[ii] = s;
        part += ks[buf][i] * s;
      }
    }
    red1[ty][tx] = part;
    __syncthreads();
    float kv = 0.0f;
#pragma unroll
    for (int r = 0; r < kRowGroups; ++r) kv += red1[r][tx];
    const float u = bs[buf] * (vs[buf][tx] - kv);

    // Rank-1 update, then partial S^T (scale q).
    float po = 0.0f;
#pragma unroll
    for (int ii = 0; ii < kMaxI; ++ii) {
      const int i = ty + ii * kRowGroups;
      if (i < dk) {
        const float s = S[ii] + ks[buf][i] * u;
        S[ii] = s;
        po += qs[buf][i] * s;
      }
    }
    red2[ty][tx] = po;
    __syncthreads();
    if (ty == 0 && col_ok) {
      float o = 0.0f;
#pragma unroll
      for (int r = 0; r < kRowGroups; ++r) o += red2[r][tx];
      out[hv_row * dv + col] = o;
    }
  }

#pragma unroll
  for (int ii = 0; ii < kMaxI; ++ii) {
    const int i = ty + ii * kRowGroups;
    if (i < dk && col_ok) S_g[static_cast<int64_t>(i) * dv + col] = S[ii];
  }
}

// f is f32 or bf16 (F), read widened; g stays f32.
template <typename F>
__global__ void kda_gate_kernel(const F* __restrict__ f, const float* __restrict__ A_log,
                                const float* __restrict__ dt_bias, float lower_bound,
                                float* __restrict__ g, int64_t n, int64_t width, int64_t per_head) {
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = idx % width;
    const float x = dev::ld(f + idx) + (dt_bias != nullptr ? dt_bias[c] : 0.0f);
    const float ah = expf(A_log[c / per_head]);
    g[idx] = lower_bound == 0.0f ? -ah * dev::softplus(x) : lower_bound * dev::sigmoid(ah * x);
  }
}

}  // namespace

namespace launch {

void kda_gate(cudaStream_t stream, const void* f, bool f_bf16, const float* A_log,
              const float* dt_bias, float lower_bound, float* g, int64_t T, int64_t width,
              int64_t H) {
  const int64_t n = T * width;
  if (n == 0) return;
  dev::with_elem(f_bf16, [&](auto ft) {
    using F = typename decltype(ft)::type;
    kda_gate_kernel<F><<<dev::grid_for(n, 256), 256, 0, stream>>>(
        static_cast<const F*>(f), A_log, dt_bias, lower_bound, g, n, width, width / H);
  });
  LOOM_CUDA_CHECK_LAUNCH();
}

void kda_recurrent(cudaStream_t stream, const float* q, const float* k, const float* v,
                   const float* g, const float* beta, float scale, float* state, float* out,
                   int64_t T, int64_t Hk, int64_t Hv, int64_t dk, int64_t dv, bool scalar_g) {
  if (Hv == 0 || dv == 0) return;
  if (dk > kMaxDk || T > 2147483647LL || Hv > 65535 * 1024LL) {
    std::fprintf(stderr, "kda_recurrent (CUDA): dk %lld > %d or T/Hv too large\n",
                 static_cast<long long>(dk), kMaxDk);
    std::abort();
  }
  const dim3 grid(static_cast<unsigned>(Hv), static_cast<unsigned>((dv + kCols - 1) / kCols));
  const dim3 block(kCols, kRowGroups);
  cudaStream_t s = stream;
  const int iT = static_cast<int>(T), iHk = static_cast<int>(Hk), iHv = static_cast<int>(Hv);
  const int idk = static_cast<int>(dk), idv = static_cast<int>(dv);
  if (dk <= 4 * kRowGroups) {
    kda_recurrent_kernel<4><<<grid, block, 0, s>>>(q, k, v, g, beta, scale, state, out, iT, iHk,
                                                   iHv, idk, idv, scalar_g);
  } else if (dk <= 8 * kRowGroups) {
    kda_recurrent_kernel<8><<<grid, block, 0, s>>>(q, k, v, g, beta, scale, state, out, iT, iHk,
                                                   iHv, idk, idv, scalar_g);
  } else if (dk <= 16 * kRowGroups) {
    kda_recurrent_kernel<16><<<grid, block, 0, s>>>(q, k, v, g, beta, scale, state, out, iT, iHk,
                                                    iHv, idk, idv, scalar_g);
  } else {
    kda_recurrent_kernel<32><<<grid, block, 0, s>>>(q, k, v, g, beta, scale, state, out, iT, iHk,
                                                    iHv, idk, idv, scalar_g);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace launch
}  // namespace loom::cuda
