// Loom's batch-invariant f32 GEMM (launch::sgemm_invariant, kernels/cuda/gemm_launch.h): the
// engine's --deterministic GEMM for f32 weights and for matmul. Plain f32 FMA, no tensor cores
// (TF32 would round the inputs to 10 mantissa bits).
//
// Why it is batch-invariant (kernels/batch_invariance.h). Output element (i, j) is
//     acc = 0; for p = 0, 1, .., k - 1: acc = fmaf(op(a)[i, p], op(b)[p, j], acc)
//     c[i, j] = beta == 0 ? alpha * acc : fmaf(beta, c[i, j], alpha * acc)
// in every configuration: one thread owns the element for the whole of k, k is never split
// across threads, warps or blocks, and a partial last k tile runs only its k - k0 real steps (no
// zero padding enters the chain, so not even the sign of a zero can depend on the tiling). Rows
// of other requests only share the tiles' loads, never the arithmetic. The tile configuration
// (rows and columns a block covers, how tiles are loaded) is chosen by m, but it decides only
// who computes an element and when, not how: a row is bit-identical in an m = 1 and an m = 300
// call, at any position (tests/gpu/gemm_cuda_test.cc checks it). fmaf is explicit and nvcc does
// not reassociate f32 adds, so the chain above is what runs.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm_launch.h"

namespace loom::cuda {
namespace {

// A block: BM x BN outputs, (BM / TM) x (BN / TN) threads, each TM x TN outputs strided by the
// thread grid (row ty + u * kTy, column tx + v * kTx: conflict-free shared reads, coalesced
// stores). k advances BK per tile; tiles are double-buffered in shared memory (k-major) with the
// next tile's global loads in registers while the current one is computed.
template <int BM, int BN, int BK, int TM, int TN, bool kTransA, bool kTransB>
__global__ void __launch_bounds__((BM / TM) * (BN / TN))
    sgemm_invariant_kernel(int64_t m, int64_t n, int64_t k, float alpha,
                           const float* __restrict__ a, int64_t lda, const float* __restrict__ b,
                           int64_t ldb, float beta, float* __restrict__ c, int64_t ldc) {
  constexpr int kTx = BN / TN, kTy = BM / TM, kThreads = kTx * kTy;
  constexpr int kLoadA = BM * BK / kThreads, kLoadB = BN * BK / kThreads;
  static_assert(BM * BK % kThreads == 0 && BN * BK % kThreads == 0);
  __shared__ float as[2][BK][BM + 1];
  __shared__ float bs[2][BK][BN + 1];
  const int tid = threadIdx.x, tx = tid % kTx, ty = tid / kTx;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * BM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * BN;

  // Element e of a tile: consecutive threads take consecutive addresses of the contiguous index
  // (k for a row-major x or a [n, k] weight, the row index otherwise).
  float ra[kLoadA], rb[kLoadB];
  auto load = [&](int64_t k0) {
#pragma unroll
    for (int u = 0; u < kLoadA; ++u) {
      const int e = tid + u * kThreads;
      const int i = kTransA ? e % BM : e / BK, p = kTransA ? e / BM : e % BK;
      const int64_t gi = m0 + i, gp = k0 + p;
      ra[u] = gi < m && gp < k ? __ldg(kTransA ? a + gp * lda + gi : a + gi * lda + gp) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kLoadB; ++u) {
      const int e = tid + u * kThreads;
      const int j = kTransB ? e / BK : e % BN, p = kTransB ? e % BK : e / BN;
      const int64_t gj = n0 + j, gp = k0 + p;
      rb[u] = gj < n && gp < k ? __ldg(kTransB ? b + gj * ldb + gp : b + gp * ldb + gj) : 0.0f;
    }
  };
  auto store = [&](int buf) {
#pragma unroll
    for (int u = 0; u < kLoadA; ++u) {
      const int e = tid + u * kThreads;
      as[buf][kTransA ? e / BM : e % BK][kTransA ? e % BM : e / BK] = ra[u];
    }
#pragma unroll
    for (int u = 0; u < kLoadB; ++u) {
      const int e = tid + u * kThreads;
      bs[buf][kTransB ? e % BK : e / BN][kTransB ? e / BK : e % BN] = rb[u];
    }
  };

  float acc[TM][TN];
#pragma unroll
  for (int u = 0; u < TM; ++u) {
#pragma unroll
    for (int v = 0; v < TN; ++v) acc[u][v] = 0.0f;
  }
  auto step = [&](int buf, int p) {
    float av[TM], bv[TN];
#pragma unroll
    for (int u = 0; u < TM; ++u) av[u] = as[buf][p][ty + u * kTy];
#pragma unroll
    for (int v = 0; v < TN; ++v) bv[v] = bs[buf][p][tx + v * kTx];
#pragma unroll
    for (int u = 0; u < TM; ++u) {
#pragma unroll
      for (int v = 0; v < TN; ++v) acc[u][v] = fmaf(av[u], bv[v], acc[u][v]);
    }
  };

  const int64_t tiles = (k + BK - 1) / BK;
  if (tiles > 0) {
    load(0);
    store(0);
    __syncthreads();
  }
  for (int64_t t = 0; t < tiles; ++t) {
    const int buf = static_cast<int>(t & 1);
    if (t + 1 < tiles) load((t + 1) * BK);
    const int64_t left = k - t * BK;
    if (left >= BK) {
#pragma unroll
      for (int p = 0; p < BK; ++p) step(buf, p);
    } else {
      for (int p = 0; p < static_cast<int>(left); ++p) step(buf, p);  // only the real steps
    }
    if (t + 1 < tiles) store(buf ^ 1);
    __syncthreads();
  }

#pragma unroll
  for (int u = 0; u < TM; ++u) {
    const int64_t i = m0 + ty + u * kTy;
    if (i >= m) continue;
#pragma unroll
    for (int v = 0; v < TN; ++v) {
      const int64_t j = n0 + tx + v * kTx;
      if (j >= n) continue;
      float* o = c + i * ldc + j;
      const float r = alpha * acc[u][v];
      *o = beta == 0.0f ? r : fmaf(beta, *o, r);
    }
  }
}

template <int BM, int BN, int BK, int TM, int TN, bool kTransA, bool kTransB>
void launch_config(cudaStream_t stream, int64_t m, int64_t n, int64_t k, float alpha,
                   const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                   int64_t ldc) {
  const int64_t gx = (n + BN - 1) / BN, gy = (m + BM - 1) / BM;
  LOOM_CHECK_GRID(gx);
  if (gy > 65535) {
    std::fprintf(stderr, "%s:%d: sgemm_invariant: %lld rows exceed the grid (at most %d)\n",
                 __FILE__, __LINE__, static_cast<long long>(m), 65535 * BM);
    std::abort();
  }
  sgemm_invariant_kernel<BM, BN, BK, TM, TN, kTransA, kTransB>
      <<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), (BM / TM) * (BN / TN), 0,
         stream>>>(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  LOOM_CUDA_CHECK_LAUNCH();
}

template <bool kTransA, bool kTransB>
void launch_by_rows(cudaStream_t stream, int64_t m, int64_t n, int64_t k, float alpha,
                    const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                    int64_t ldc) {
  // Tile sizes by m (the arithmetic of an element is the same in all three; see the top).
  if (m <= 16) {  // decode: many narrow blocks streaming b through deep k tiles
    launch_config<16, 16, 64, 4, 1, kTransA, kTransB>(stream, m, n, k, alpha, a, lda, b, ldb, beta,
                                                      c, ldc);
  } else if (m <= 128) {
    launch_config<32, 64, 16, 2, 4, kTransA, kTransB>(stream, m, n, k, alpha, a, lda, b, ldb, beta,
                                                      c, ldc);
  } else {
    launch_config<128, 128, 8, 8, 8, kTransA, kTransB>(stream, m, n, k, alpha, a, lda, b, ldb, beta,
                                                       c, ldc);
  }
}

}  // namespace

namespace launch {

void sgemm_invariant(cudaStream_t stream, bool trans_a, bool trans_b, int64_t m, int64_t n,
                     int64_t k, float alpha, const float* a, int64_t lda, const float* b,
                     int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (trans_a) {
    if (trans_b)
      return launch_by_rows<true, true>(stream, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return launch_by_rows<true, false>(stream, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  if (trans_b)
    return launch_by_rows<false, true>(stream, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  return launch_by_rows<false, false>(stream, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace launch
}  // namespace loom::cuda
