// Causal attention for training, tiled in the manner of FlashAttention-2, f32 on CUDA cores (the
// trainer's precision): the gradients must stay within 1e-4 of the CPU's, which TF32 tensor cores
// would not promise.
//
// Tiles of 64 query rows and 64 keys, both aligned to their sequence's first row, so that a
// sequence of a packed batch sees the same tiles, sums and bits as a call for it alone. A block
// of 256 threads (16 x 16) holds its tiles in shared memory and gives each thread a 4 x 4 piece of
// a 64 x 64 product: rows ty + 16 a, columns tx + 16 b. Row-major tiles have an odd leading
// dimension, so that 16 lanes walking down a column touch 16 banks; columns past d (dv) are zero.
//  - forward: a block per (query tile, sequence, head); the key tiles in order with the online
//    softmax (running max and sum), O and the log-sum-exp at the end;
//  - D_i = dO_i . O_i, a warp per (row, head);
//  - dq: a block per (query tile, sequence, head): P = exp(S - lse), dP = dO V^T,
//    dS = P (dP - D) scale, dq += dS K over the key tiles in order;
//  - dk, dv: a block per (key tile, sequence, kv head): for each of its query heads in order and
//    each query tile from the key tile on, dv += P^T dO and dk += dS^T Q.
// Nothing is accumulated with atomics: the same inputs give the same bits.
// Query tiles are launched last first (the causal triangle makes them the longest).
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "kernels/cuda/attention_train_launch.h"
#include "kernels/cuda/common.cuh"

namespace loom::cuda {
namespace {

constexpr int kTile = 64;
constexpr int kThreads = 256;
constexpr int kLdP = kTile + 1;  // the 64 x 64 score tile in shared memory

struct Args {
  const float *q, *k, *v, *out, *lse, *d_out;
  float *d_rows, *o, *lse_out, *dq, *dk, *dv;
  float scale;
  const int64_t* cu;
  int64_t T, Hq, Hkv, nseq;
  int d, dv_dim;
};

__device__ __forceinline__ int64_t imin64(int64_t x, int64_t y) { return x < y ? x : y; }

struct Seq {
  int64_t begin, len;
};
__device__ __forceinline__ Seq seq_of(const Args& a, int64_t s) {
  if (a.cu == nullptr) return {0, a.T};
  return {a.cu[s], a.cu[s + 1] - a.cu[s]};
}

__device__ __forceinline__ float half_warp_max(float x) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float half_warp_sum(float x) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Rows [r0, r0 + 64) of a [T, H, width] tensor at head h, from the sequence's first row `base`,
// into dst [64][ld]: rows past `rows` and columns past `width` (up to ld - 1) zero.
__device__ __forceinline__ void load_rows(float* dst, int ld, const float* src, int64_t base,
                                          int64_t H, int64_t h, int width, int rows) {
  const int cols = ld - 1;
  for (int idx = threadIdx.x; idx < kTile * cols; idx += kThreads) {
    const int r = idx / cols, c = idx - r * cols;
    dst[r * ld + c] = r < rows && c < width ? src[((base + r) * H + h) * width + c] : 0.0f;
  }
}

// Shared memory (floats) of each kernel for the padded widths DT * 16, DVT * 16.
template <int DT, int DVT>
struct Smem {
  static constexpr int ldq = 16 * DT + 1, ldv = 16 * DVT + 1;
  static constexpr size_t fwd = kTile * (2 * ldq + ldv + kLdP);
  static constexpr size_t dq = kTile * (2 * ldq + 2 * ldv + kLdP);
  static constexpr size_t dkv = kTile * (2 * ldq + 2 * ldv + kLdP) + 2 * kTile;
};

template <int DT, int DVT>
__global__ void __launch_bounds__(kThreads) attn_tiled_fwd_kernel(Args a) {
  using Sm = Smem<DT, DVT>;
  constexpr int ldq = Sm::ldq, ldv = Sm::ldv;
  extern __shared__ float smem[];
  float* sQ = smem;
  float* sK = sQ + kTile * ldq;
  float* sV = sK + kTile * ldq;
  float* sP = sV + kTile * ldv;
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  const int64_t h = blockIdx.z, hk = h / (a.Hq / a.Hkv);
  const Seq sq = seq_of(a, blockIdx.y);
  const int64_t r0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kTile;
  if (r0 >= sq.len) return;
  const int rows = static_cast<int>(imin64(kTile, sq.len - r0));
  load_rows(sQ, ldq, a.q, sq.begin + r0, a.Hq, h, a.d, rows);
  float m[4], l[4], o[4][DVT];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int c = 0; c < DVT; ++c) o[i][c] = 0.0f;
  }
  for (int64_t k0 = 0; k0 < r0 + rows; k0 += kTile) {
    const int keys = static_cast<int>(imin64(kTile, sq.len - k0));
    __syncthreads();  // the previous tile's reads are done
    load_rows(sK, ldq, a.k, sq.begin + k0, a.Hkv, hk, a.d, keys);
    load_rows(sV, ldv, a.v, sq.begin + k0, a.Hkv, hk, a.dv_dim, keys);
    __syncthreads();
    float s[4][4] = {};
#pragma unroll 4
    for (int c = 0; c < a.d; ++c) {
      float qv[4], kv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        qv[i] = sQ[(ty + 16 * i) * ldq + c];
        kv[i] = sK[(tx + 16 * i) * ldq + c];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) s[i][j] += qv[i] * kv[j];
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t row = r0 + ty + 16 * i;
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t key = k0 + tx + 16 * j;
        s[i][j] = key <= row ? s[i][j] * a.scale : -INFINITY;
        mx = fmaxf(mx, s[i][j]);
      }
      // Every row sees its key 0 in the first tile, so the running max is finite from there on
      // (rows past the sequence are never stored).
      const float mn = fmaxf(m[i], half_warp_max(mx));
      const float alpha = expf(m[i] - mn);
      float ps = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float p = expf(s[i][j] - mn);
        sP[(ty + 16 * i) * kLdP + tx + 16 * j] = p;
        ps += p;
      }
      l[i] = l[i] * alpha + half_warp_sum(ps);
      m[i] = mn;
#pragma unroll
      for (int c = 0; c < DVT; ++c) o[i][c] *= alpha;
    }
    __syncthreads();
    for (int j = 0; j < keys; ++j) {
      float pv[4], vv[DVT];
#pragma unroll
      for (int i = 0; i < 4; ++i) pv[i] = sP[(ty + 16 * i) * kLdP + j];
#pragma unroll
      for (int c = 0; c < DVT; ++c) vv[c] = sV[j * ldv + tx + 16 * c];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int c = 0; c < DVT; ++c) o[i][c] += pv[i] * vv[c];
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = ty + 16 * i;
    if (r >= rows) continue;
    const int64_t row = sq.begin + r0 + r;
#pragma unroll
    for (int c = 0; c < DVT; ++c) {
      const int col = tx + 16 * c;
      if (col < a.dv_dim) a.o[(row * a.Hq + h) * a.dv_dim + col] = o[i][c] / l[i];
    }
    if (tx == 0) a.lse_out[row * a.Hq + h] = m[i] + logf(l[i]);
  }
}

// D_i = dO_i . O_i, a warp per (row, head).
__global__ void __launch_bounds__(kThreads) attn_rows_dot_kernel(Args a) {
  const int64_t w = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (w >= a.T * a.Hq) return;
  float s = 0.0f;
  for (int c = lane; c < a.dv_dim; c += 32)
    s += a.d_out[w * a.dv_dim + c] * a.out[w * a.dv_dim + c];
  s = dev::warp_sum(s);
  if (lane == 0) a.d_rows[w] = s;
}

template <int DT, int DVT>
__global__ void __launch_bounds__(kThreads) attn_tiled_dq_kernel(Args a) {
  using Sm = Smem<DT, DVT>;
  constexpr int ldq = Sm::ldq, ldv = Sm::ldv;
  extern __shared__ float smem[];
  float* sQ = smem;
  float* sK = sQ + kTile * ldq;
  float* sO = sK + kTile * ldq;  // dO
  float* sV = sO + kTile * ldv;
  float* sS = sV + kTile * ldv;  // dS
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  const int64_t h = blockIdx.z, hk = h / (a.Hq / a.Hkv);
  const Seq sq = seq_of(a, blockIdx.y);
  const int64_t r0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kTile;
  if (r0 >= sq.len) return;
  const int rows = static_cast<int>(imin64(kTile, sq.len - r0));
  load_rows(sQ, ldq, a.q, sq.begin + r0, a.Hq, h, a.d, rows);
  load_rows(sO, ldv, a.d_out, sq.begin + r0, a.Hq, h, a.dv_dim, rows);
  float lse[4], D[4], acc[4][DT];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = ty + 16 * i;
    const int64_t row = sq.begin + r0 + (r < rows ? r : 0);
    lse[i] = a.lse[row * a.Hq + h];
    D[i] = a.d_rows[row * a.Hq + h];
#pragma unroll
    for (int c = 0; c < DT; ++c) acc[i][c] = 0.0f;
  }
  for (int64_t k0 = 0; k0 < r0 + rows; k0 += kTile) {
    const int keys = static_cast<int>(imin64(kTile, sq.len - k0));
    __syncthreads();
    load_rows(sK, ldq, a.k, sq.begin + k0, a.Hkv, hk, a.d, keys);
    load_rows(sV, ldv, a.v, sq.begin + k0, a.Hkv, hk, a.dv_dim, keys);
    __syncthreads();
    float s[4][4] = {}, dp[4][4] = {};
#pragma unroll 4
    for (int c = 0; c < a.d; ++c) {
      float qv[4], kv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        qv[i] = sQ[(ty + 16 * i) * ldq + c];
        kv[i] = sK[(tx + 16 * i) * ldq + c];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) s[i][j] += qv[i] * kv[j];
    }
#pragma unroll 4
    for (int c = 0; c < a.dv_dim; ++c) {
      float ov[4], vv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        ov[i] = sO[(ty + 16 * i) * ldv + c];
        vv[i] = sV[(tx + 16 * i) * ldv + c];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) dp[i][j] += ov[i] * vv[j];
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t row = r0 + ty + 16 * i;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t key = k0 + tx + 16 * j;
        const float p = key <= row && row < sq.len ? expf(s[i][j] * a.scale - lse[i]) : 0.0f;
        sS[(ty + 16 * i) * kLdP + tx + 16 * j] = p * (dp[i][j] - D[i]) * a.scale;
      }
    }
    __syncthreads();
    for (int j = 0; j < keys; ++j) {
      float dsv[4], kv[DT];
#pragma unroll
      for (int i = 0; i < 4; ++i) dsv[i] = sS[(ty + 16 * i) * kLdP + j];
#pragma unroll
      for (int c = 0; c < DT; ++c) kv[c] = sK[j * ldq + tx + 16 * c];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int c = 0; c < DT; ++c) acc[i][c] += dsv[i] * kv[c];
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = ty + 16 * i;
    if (r >= rows) continue;
    const int64_t row = sq.begin + r0 + r;
#pragma unroll
    for (int c = 0; c < DT; ++c) {
      const int col = tx + 16 * c;
      if (col < a.d) a.dq[(row * a.Hq + h) * a.d + col] = acc[i][c];
    }
  }
}

template <int DT, int DVT>
__global__ void __launch_bounds__(kThreads) attn_tiled_dkv_kernel(Args a) {
  using Sm = Smem<DT, DVT>;
  constexpr int ldq = Sm::ldq, ldv = Sm::ldv;
  extern __shared__ float smem[];
  float* sK = smem;
  float* sQ = sK + kTile * ldq;
  float* sV = sQ + kTile * ldq;
  float* sO = sV + kTile * ldv;  // dO
  float* sX = sO + kTile * ldv;  // P^T, then dS^T
  float* sL = sX + kTile * kLdP;
  float* sD = sL + kTile;
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  const int64_t hk = blockIdx.z, group = a.Hq / a.Hkv;
  const Seq sq = seq_of(a, blockIdx.y);
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kTile;  // the short key tiles last
  if (j0 >= sq.len) return;
  const int keys = static_cast<int>(imin64(kTile, sq.len - j0));
  load_rows(sK, ldq, a.k, sq.begin + j0, a.Hkv, hk, a.d, keys);
  load_rows(sV, ldv, a.v, sq.begin + j0, a.Hkv, hk, a.dv_dim, keys);
  float dka[4][DT], dva[4][DVT];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int c = 0; c < DT; ++c) dka[i][c] = 0.0f;
#pragma unroll
    for (int c = 0; c < DVT; ++c) dva[i][c] = 0.0f;
  }
  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
    for (int64_t q0 = j0; q0 < sq.len; q0 += kTile) {
      const int rows = static_cast<int>(imin64(kTile, sq.len - q0));
      __syncthreads();
      load_rows(sQ, ldq, a.q, sq.begin + q0, a.Hq, h, a.d, rows);
      load_rows(sO, ldv, a.d_out, sq.begin + q0, a.Hq, h, a.dv_dim, rows);
      for (int r = tid; r < kTile; r += kThreads) {
        const int64_t row = (sq.begin + q0 + (r < rows ? r : 0)) * a.Hq + h;
        sL[r] = a.lse[row];
        sD[r] = a.d_rows[row];
      }
      __syncthreads();
      // Transposed products: row (ty + 16 i) is a key, column (tx + 16 j) a query.
      float s[4][4] = {}, dp[4][4] = {};
#pragma unroll 4
      for (int c = 0; c < a.d; ++c) {
        float kv[4], qv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          kv[i] = sK[(ty + 16 * i) * ldq + c];
          qv[i] = sQ[(tx + 16 * i) * ldq + c];
        }
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) s[i][j] += kv[i] * qv[j];
      }
#pragma unroll 4
      for (int c = 0; c < a.dv_dim; ++c) {
        float vv[4], ov[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          vv[i] = sV[(ty + 16 * i) * ldv + c];
          ov[i] = sO[(tx + 16 * i) * ldv + c];
        }
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) dp[i][j] += vv[i] * ov[j];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t key = j0 + ty + 16 * i;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int col = tx + 16 * j;
          const int64_t row = q0 + col;
          const float p = key <= row && row < sq.len ? expf(s[i][j] * a.scale - sL[col]) : 0.0f;
          sX[(ty + 16 * i) * kLdP + col] = p;
          dp[i][j] = p * (dp[i][j] - sD[col]) * a.scale;  // dS^T
        }
      }
      __syncthreads();
      for (int r = 0; r < rows; ++r) {
        float pv[4], ov[DVT];
#pragma unroll
        for (int i = 0; i < 4; ++i) pv[i] = sX[(ty + 16 * i) * kLdP + r];
#pragma unroll
        for (int c = 0; c < DVT; ++c) ov[c] = sO[r * ldv + tx + 16 * c];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int c = 0; c < DVT; ++c) dva[i][c] += pv[i] * ov[c];
      }
      __syncthreads();
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) sX[(ty + 16 * i) * kLdP + tx + 16 * j] = dp[i][j];
      __syncthreads();
      for (int r = 0; r < rows; ++r) {
        float dsv[4], qv[DT];
#pragma unroll
        for (int i = 0; i < 4; ++i) dsv[i] = sX[(ty + 16 * i) * kLdP + r];
#pragma unroll
        for (int c = 0; c < DT; ++c) qv[c] = sQ[r * ldq + tx + 16 * c];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int c = 0; c < DT; ++c) dka[i][c] += dsv[i] * qv[c];
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = ty + 16 * i;
    if (r >= keys) continue;
    const int64_t row = (sq.begin + j0 + r) * a.Hkv + hk;
#pragma unroll
    for (int c = 0; c < DT; ++c) {
      const int col = tx + 16 * c;
      if (col < a.d) a.dk[row * a.d + col] = dka[i][c];
    }
#pragma unroll
    for (int c = 0; c < DVT; ++c) {
      const int col = tx + 16 * c;
      if (col < a.dv_dim) a.dv[row * a.dv_dim + col] = dva[i][c];
    }
  }
}

template <class Kernel>
void launch_tiled(Kernel kernel, size_t floats, dim3 grid, cudaStream_t stream, const Args& a) {
  const size_t bytes = floats * sizeof(float);
  if (bytes > 48 * 1024)
    LOOM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(bytes)));
  kernel<<<grid, kThreads, bytes, stream>>>(a);
  LOOM_CUDA_CHECK_LAUNCH();
}

// Calls fn.template operator()<DT, DVT>() for the padded widths of d and dv.
template <class Fn>
void with_widths(int64_t d, int64_t dv, Fn&& fn) {
  const auto v = [&](auto dt) {
    if (dv <= 64)
      fn.template operator()<decltype(dt)::value, 4>();
    else
      fn.template operator()<decltype(dt)::value, 8>();
  };
  if (d <= 64)
    v(std::integral_constant<int, 4>{});
  else if (d <= 96)
    v(std::integral_constant<int, 6>{});
  else if (d <= 128)
    v(std::integral_constant<int, 8>{});
  else
    v(std::integral_constant<int, 12>{});
}

Args make_args(const float* q, const float* k, const float* v, float scale, int64_t T, int64_t Hq,
               int64_t Hkv, int64_t d, int64_t dv, const int64_t* cu, int64_t nseq) {
  Args a{};
  a.q = q;
  a.k = k;
  a.v = v;
  a.scale = scale;
  a.T = T;
  a.Hq = Hq;
  a.Hkv = Hkv;
  a.d = static_cast<int>(d);
  a.dv_dim = static_cast<int>(dv);
  a.cu = cu;
  a.nseq = cu != nullptr ? nseq : 1;
  return a;
}

dim3 tile_grid(int64_t T, int64_t nseq, int64_t heads, const int64_t* cu, int64_t max_T) {
  const int64_t len = cu != nullptr ? max_T : T;
  const int64_t tiles = (len + kTile - 1) / kTile;
  LOOM_CHECK_GRID(tiles);
  if (nseq > 65535 || heads > 65535) {
    std::fprintf(stderr,
                 "causal attention (CUDA): %lld sequences x %lld heads; at most 65535 each\n",
                 static_cast<long long>(nseq), static_cast<long long>(heads));
    std::abort();
  }
  return dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(nseq),
              static_cast<unsigned>(heads));
}

}  // namespace

namespace launch {

void causal_attention_tiled_forward(cudaStream_t stream, const float* q, const float* k,
                                    const float* v, float scale, int64_t T, int64_t Hq, int64_t Hkv,
                                    int64_t d, int64_t dv, float* out, float* lse,
                                    const int64_t* cu, int64_t nseq, int64_t max_T) {
  if (T == 0 || Hq == 0) return;
  Args a = make_args(q, k, v, scale, T, Hq, Hkv, d, dv, cu, nseq);
  a.o = out;
  a.lse_out = lse;
  const dim3 grid = tile_grid(T, a.nseq, Hq, cu, max_T);
  with_widths(d, dv, [&]<int DT, int DVT>() {
    launch_tiled(attn_tiled_fwd_kernel<DT, DVT>, Smem<DT, DVT>::fwd, grid, stream, a);
  });
}

void causal_attention_tiled_backward(cudaStream_t stream, const float* q, const float* k,
                                     const float* v, const float* out, const float* lse,
                                     const float* d_out, float scale, int64_t T, int64_t Hq,
                                     int64_t Hkv, int64_t d, int64_t dv, float* d_rows, float* dq,
                                     float* dk, float* dvv, const int64_t* cu, int64_t nseq,
                                     int64_t max_T) {
  if (T == 0 || Hq == 0) return;
  Args a = make_args(q, k, v, scale, T, Hq, Hkv, d, dv, cu, nseq);
  a.out = out;
  a.lse = lse;
  a.d_out = d_out;
  a.d_rows = d_rows;
  a.dq = dq;
  a.dk = dk;
  a.dv = dvv;
  const int64_t warps = T * Hq;
  attn_rows_dot_kernel<<<static_cast<unsigned>((warps * 32 + kThreads - 1) / kThreads), kThreads, 0,
                         stream>>>(a);
  LOOM_CUDA_CHECK_LAUNCH();
  const dim3 qgrid = tile_grid(T, a.nseq, Hq, cu, max_T);
  const dim3 kgrid = tile_grid(T, a.nseq, Hkv, cu, max_T);
  with_widths(d, dv, [&]<int DT, int DVT>() {
    launch_tiled(attn_tiled_dq_kernel<DT, DVT>, Smem<DT, DVT>::dq, qgrid, stream, a);
    launch_tiled(attn_tiled_dkv_kernel<DT, DVT>, Smem<DT, DVT>::dkv, kgrid, stream, a);
  });
}

}  // namespace launch
}  // namespace loom::cuda
