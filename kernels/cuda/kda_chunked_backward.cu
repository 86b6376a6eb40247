// The chunked (WY/UT) delta-rule backward on CUDA: the algorithm and notation of its CPU twin
// (kernels/cpu/kda_chunked_backward.cc has the equations), in two forms.
//
// Chunk-parallel (the shapes the forward's chunked kernels take; "the chunk-parallel form" below):
// the forward's kernels keep the state before every chunk, the state pass in reverse gives the
// state's gradient after every chunk, then every (chunk, value head) recomputes its A, P, U from
// its state and runs its reverse mode, all at once.
// Sequential (any other shape): one block per value head of each sequence runs the chunked forward
// from the initial state keeping the state before each 64-token chunk, then walks the chunks last
// first, recomputing each from its state, running its reverse mode and carrying dS to the chunk
// before.
// Either way a sequence of a packed batch gets exactly what a launch for it alone gives. The
// per-chunk steps are loops over the block's threads with a barrier after each; no warp-level
// tricks, no atomics, so the result does not depend on scheduling. Chunk buffers live in
// per-block global scratch (about 0.6 MB a block at dk = dv = 128), except in the chunk-parallel
// form when the tiles its loops read across rows fit one block's shared memory (dk, dv <= 64: 211
// KB at 64 x 64, one block an SM): there they sit in shared memory with padded rows (HeadWork),
// 2.4x faster at the bundled default's 4 heads of 64 than the all-global layout.
//
// Exponentials: every factor is exp of a difference <= 0 (gc_t - gc_s for s <= t, gc_t itself,
// gc_L - gc_s), formed element by element from f64 cumulative decays: no diagonal block is
// factorised through a reference point here, so no factor exceeds 1 and gradients of any scale
// stay in the f32 range.
//
// dg: as on the CPU, each pair (t, s < t) of the chunk adds one term w_ts to dg_u for s < u <= t.
// The row pass sums w over s for each t, the column pass over t for each s, both in f64 and with
// the very same f32 value of w (pair_term), so that the prefix sum dg_u = sum_{s < u} colsum_s -
// sum_{t < u} rowsum_t cancels the pairs with both ends before u exactly.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kda_chunked_backward_launch.h"
#include "kernels/cuda/kda_chunked_launch.h"

namespace loom::cuda {
namespace {

using launch::KdaBackwardArgs;
constexpr int64_t kC = 64;    // kKdaChunk (kernels/kda.h)
constexpr int64_t kSub = 16;  // rows per step of the triangular solves
constexpr int kThreads = 512;

__host__ __device__ inline int64_t chunks_of(int64_t T) { return (T + kC - 1) / kC; }

// The block's 512 threads over a tile of at most 64 x 64 outputs, rows [0, rows) and columns
// [n0, cols): each thread has rows ty + 32 r (r < 2) and columns n0 + tx + 16 c (c < 4), with
// ty = tid / 16 and tx = tid % 16, and loads its operands from rows and columns clamped into range
// (what those give is dropped). A thread then loads 2 + 4 operands a term for 8 outputs, where
// a thread per output loaded 2 or more a term: the chunk's products are bound by shared-memory and
// L1 load instructions, not by arithmetic. Each output still sums its terms in ascending order,
// one fused multiply-add (or the same rounded operations) each, so the bits are the per-output
// loops'. In a lower-triangular product (column <= row), the pieces r = 0, c >= 2 (columns from
// 32 on, rows below 32) are never inside: upper() names them.
struct OutputQuad {
  static constexpr int kRows = 2, kCols = 4;
  int row[kRows], col[kCols];    // the outputs
  int lrow[kRows], lcol[kCols];  // where their operands are loaded from
  __device__ OutputQuad(int64_t rows, int64_t n0, int64_t cols) {
    const int ty = static_cast<int>(threadIdx.x) / 16, tx = static_cast<int>(threadIdx.x) % 16;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      row[r] = ty + 32 * r;
      lrow[r] = row[r] < rows ? row[r] : static_cast<int>(rows) - 1;
    }
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      col[c] = static_cast<int>(n0) + tx + 16 * c;
      lcol[c] = col[c] < cols ? col[c] : static_cast<int>(cols) - 1;
    }
  }
  __device__ bool inside(int r, int c, int64_t rows, int64_t cols) const {
    return row[r] < rows && col[c] < cols;
  }
  static __device__ constexpr bool upper(int r, int c) { return r == 0 && c >= 2; }

  // acc[r][c] += a(lrow[r], k) * b(k, lcol[c]) for k in [k0, k1), in order; kLower skips the
  // pieces upper() names.
  template <bool kLower = false, class A, class B>
  __device__ void accumulate(float (&acc)[kRows][kCols], int64_t k0, int64_t k1, A a, B b) const {
    for (int64_t k = k0; k < k1; ++k) {
      float x[kRows], y[kCols];
#pragma unroll
      for (int r = 0; r < kRows; ++r) x[r] = a(lrow[r], k);
#pragma unroll
      for (int c = 0; c < kCols; ++c) y[c] = b(k, lcol[c]);
#pragma unroll
      for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int c = 0; c < kCols; ++c)
          if (!kLower || !upper(r, c)) acc[r][c] += x[r] * y[c];
    }
  }
  // Two products sharing their right operand: acc1 += a1 b, acc2 += a2 b (one load of b a term).
  template <bool kLower = false, class A1, class A2, class B>
  __device__ void accumulate2(float (&acc1)[kRows][kCols], float (&acc2)[kRows][kCols], int64_t k0,
                              int64_t k1, A1 a1, A2 a2, B b) const {
    for (int64_t k = k0; k < k1; ++k) {
      float x1[kRows], x2[kRows], y[kCols];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        x1[r] = a1(lrow[r], k);
        x2[r] = a2(lrow[r], k);
      }
#pragma unroll
      for (int c = 0; c < kCols; ++c) y[c] = b(k, lcol[c]);
#pragma unroll
      for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int c = 0; c < kCols; ++c)
          if (!kLower || !upper(r, c)) {
            acc1[r][c] += x1[r] * y[c];
            acc2[r][c] += x2[r] * y[c];
          }
    }
  }
  // f(row, col, r, c) for each output inside [0, rows) x [0, cols).
  template <class F>
  __device__ void each_inside(int64_t rows, int64_t cols, F f) const {
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int c = 0; c < kCols; ++c)
        if (inside(r, c, rows, cols)) f(row[r], col[c], r, c);
  }
};
static_assert(kThreads == 512 && kC == 64, "OutputQuad covers 64 x 64 outputs with 512 threads");

// One value head's chunk buffers (f64 ones first, so every region stays 8-byte aligned). The tiles
// the chunk's loops read across rows (Q, K, gd with row stride rk; VW, U, dO, dR and the state's
// rows S0, dS with row stride rv) either sit in global scratch (rk = dk, rv = dv) or, when they
// fit, in shared memory with odd row strides (rk = dk + 1, rv = dv + 1), so that a warp reading a
// column touches 32 different banks. The others (row-major [L, dk]) stay in global scratch. P and
// dP share one buffer: P is dead once dU is formed, before dP is.
struct HeadWork {
  double *gd, *rw, *cw, *dgc, *sd;
  float *Q, *K, *Qe, *Ke, *Kend, *dQe, *mKe, *dKend, *qrow, *krow, *kcol;
  float *VW, *U, *dO, *dR;
  float *A, *P, *dP, *dA;
  float *S0, *dS, *beta;
  int64_t rk, rv;
};

// Hands out consecutive regions of a float buffer (f64 regions take two floats an element).
struct Carver {
  float* p;
  __device__ double* take_d(int64_t n) {
    double* r = reinterpret_cast<double*>(p);
    p += 2 * n;
    return r;
  }
  __device__ float* take(int64_t n) {
    float* r = p;
    p += n;
    return r;
  }
};

// The tiles that may live in shared memory, carved from c with row strides rk, rv.
__device__ inline void carve_row_tiles(HeadWork& w, Carver& c, int64_t dk, int64_t rk, int64_t rv) {
  w.rk = rk;
  w.rv = rv;
  w.gd = c.take_d(kC * rk);
  w.Q = c.take(kC * rk);
  w.K = c.take(kC * rk);
  w.VW = c.take(kC * rv);
  w.U = c.take(kC * rv);
  w.dO = c.take(kC * rv);
  w.dR = c.take(kC * rv);
  w.A = c.take(kC * kC);
  w.P = w.dP = c.take(kC * kC);
  w.dA = c.take(kC * kC);
  w.S0 = c.take(dk * rv);
  w.dS = c.take(dk * rv);
  w.beta = c.take(kC);
}

__host__ __device__ inline int64_t row_tile_floats(int64_t dk, int64_t rk, int64_t rv) {
  return 4 * kC * rk + 4 * kC * rv + 3 * kC * kC + 2 * dk * rv + kC;
}

// The [L, dk] buffers that always stay in global scratch.
__device__ inline void carve_global_tiles(HeadWork& w, Carver& c, int64_t dk) {
  const int64_t cd = kC * dk;
  w.rw = c.take_d(cd);
  w.cw = c.take_d(cd);
  w.dgc = c.take_d(cd);
  w.sd = c.take_d(dk);
  w.Qe = c.take(cd);
  w.Ke = c.take(cd);
  w.Kend = c.take(cd);
  w.dQe = c.take(cd);
  w.mKe = c.take(cd);
  w.dKend = c.take(cd);
  w.qrow = c.take(cd);
  w.krow = c.take(cd);
  w.kcol = c.take(cd);
}

__host__ __device__ inline int64_t global_tile_floats(int64_t dk) {
  return 2 * (3 * kC * dk + dk) + 9 * kC * dk;
}

// Shared-memory bytes of the row tiles with padded strides (the chunk-parallel form uses them when
// they fit one block's shared memory).
__host__ inline size_t shared_row_tile_bytes(int64_t dk, int64_t dv) {
  return static_cast<size_t>(row_tile_floats(dk, dk + 1, dv + 1)) * sizeof(float);
}

// Floats of global scratch per block: everything, or only the global tiles.
__host__ __device__ inline int64_t head_work_floats(int64_t dk, int64_t dv, bool row_tiles_shared) {
  return global_tile_floats(dk) + (row_tiles_shared ? 0 : row_tile_floats(dk, dk, dv));
}

// Block `blk`'s chunk buffers, all in global scratch.
__device__ inline HeadWork head_work(const KdaBackwardArgs& a, int64_t blk) {
  HeadWork w;
  Carver c{a.scratch + blk * head_work_floats(a.dk, a.dv, false)};
  carve_row_tiles(w, c, a.dk, a.dk, a.dv);
  carve_global_tiles(w, c, a.dk);
  return w;
}

// Blocks of a launch: one per (sequence, value head).
__host__ __device__ inline int64_t blocks_of_launch(const KdaBackwardArgs& a) {
  return a.num_seqs * a.Hv;
}

__device__ inline float* head_ckpt(const KdaBackwardArgs& a, int64_t blk) {
  return a.scratch + blocks_of_launch(a) * head_work_floats(a.dk, a.dv, false) +
         blk * chunks_of(a.max_T) * a.dk * a.dv;
}

__host__ __device__ inline float* shares_base(const KdaBackwardArgs& a) {
  return a.scratch + blocks_of_launch(a) *
                         (head_work_floats(a.dk, a.dv, false) + chunks_of(a.max_T) * a.dk * a.dv);
}

// The arguments as one sequence sees them: every row pointer moved to its first row, T its
// length, the states its own (a single sequence: the arguments as given).
__device__ inline KdaBackwardArgs sequence_args(const KdaBackwardArgs& a, int64_t s) {
  if (a.cu_seqlens == nullptr) return a;
  KdaBackwardArgs l = a;
  const int64_t r = a.cu_seqlens[s], gw = a.scalar_g ? 1 : a.dk, area = a.dk * a.dv;
  l.T = a.cu_seqlens[s + 1] - r;
  l.q += r * a.Hk * a.dk;
  l.k += r * a.Hk * a.dk;
  l.v += r * a.Hv * a.dv;
  l.g += r * a.Hv * gw;
  l.beta += r * a.Hv;
  l.d_out += r * a.Hv * a.dv;
  l.dq += r * a.Hk * a.dk;
  l.dk_out += r * a.Hk * a.dk;
  l.dv_out += r * a.Hv * a.dv;
  l.dg += r * a.Hv * gw;
  l.dbeta += r * a.Hv;
  if (l.s0 != nullptr) l.s0 += s * a.Hv * area;
  if (l.d_final != nullptr) l.d_final += s * a.Hv * area;
  if (l.d_s0 != nullptr) l.d_s0 += s * a.Hv * area;
  return l;
}

// exp(x) of an f64 exponent x <= 0 (a decay or a difference of decays), to f32.
__device__ __forceinline__ float exp_le0(double x) { return expf(static_cast<float>(x)); }

// The pair (t, s <= t) of one channel: its column term (dP_ts Q_t + dA_ts K_t) E_ts and its dg
// term w_ts = column term * K_s. Rounded operations only (no contraction), so that the row and the
// column pass, which both call it, get the same bits.
struct PairTerm {
  float col, w;
};
__device__ __forceinline__ PairTerm pair_term(float dp, float da, float qt, float kt, float ks,
                                              float e) {
  const float x = __fadd_rn(__fmul_rn(dp, qt), __fmul_rn(da, kt));
  const float col = __fmul_rn(x, e);
  return {col, __fmul_rn(col, ks)};
}

// Loads chunk [t0, t0 + L) of head h and recomputes its forward from w.S0: gd, Q, K, Qe, Ke,
// Kend, A, P (when want_p), VW = V - Ke S0 and U. Ends with a barrier.
__device__ void recompute_chunk(const KdaBackwardArgs& a, const HeadWork& w, int64_t h, int64_t t0,
                                int64_t L, bool want_p) {
  const int64_t dk = a.dk, dv = a.dv, hk = h / (a.Hv / a.Hk), gw = a.scalar_g ? 1 : dk;
  const int64_t rk = w.rk, rv = w.rv;
  const int tid = threadIdx.x, nt = blockDim.x;
  for (int64_t idx = tid; idx < L * dk; idx += nt) {
    const int64_t t = idx / dk, c = idx % dk, src = ((t0 + t) * a.Hk + hk) * dk + c;
    w.Q[t * rk + c] = a.q[src] * a.scale;
    w.K[t * rk + c] = a.k[src];
  }
  for (int64_t idx = tid; idx < L * dv; idx += nt) {
    const int64_t t = idx / dv, j = idx % dv;
    w.VW[t * rv + j] = a.v[((t0 + t) * a.Hv + h) * dv + j];
  }
  for (int64_t t = tid; t < L; t += nt) w.beta[t] = a.beta[(t0 + t) * a.Hv + h];
  for (int64_t c = tid; c < dk; c += nt) {
    double acc = 0.0;
    for (int64_t t = 0; t < L; ++t) {
      acc += a.g[((t0 + t) * a.Hv + h) * gw + (a.scalar_g ? 0 : c)];
      w.gd[t * rk + c] = acc;
    }
  }
  __syncthreads();
  const double* gl = w.gd + (L - 1) * rk;
  for (int64_t idx = tid; idx < L * dk; idx += nt) {
    const int64_t t = idx / dk, c = idx % dk, r = t * rk + c;
    const float e = exp_le0(w.gd[r]);
    w.Qe[idx] = w.Q[r] * e;
    w.Ke[idx] = w.K[r] * e;
    w.Kend[idx] = w.K[r] * exp_le0(gl[c] - w.gd[r]);
  }
  // A_ts (s < t) and P_ts (s <= t): rows t, columns s (a pair s > t may overflow; it is dropped).
  {
    const OutputQuad o(L, 0, L);
    float av[2][4] = {}, pv[2][4] = {};
    for (int64_t c = 0; c < dk; ++c) {
      float kt[2], qt[2], ks[4];
      double gt[2], gs[4];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        kt[r] = w.K[o.lrow[r] * rk + c];
        qt[r] = w.Q[o.lrow[r] * rk + c];
        gt[r] = w.gd[o.lrow[r] * rk + c];
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        ks[j] = w.K[o.lcol[j] * rk + c];
        gs[j] = w.gd[o.lcol[j] * rk + c];
      }
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if (OutputQuad::upper(r, j)) continue;
          const float ke = ks[j] * exp_le0(gt[r] - gs[j]);
          av[r][j] += kt[r] * ke;
          pv[r][j] += qt[r] * ke;
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (!o.inside(r, j, L, L)) continue;
        const int t = o.row[r], s = o.col[j];
        w.A[t * kC + s] = s < t ? av[r][j] : 0.0f;
        if (want_p) w.P[t * kC + s] = s <= t ? pv[r][j] : 0.0f;
      }
  }
  __syncthreads();
  // VW = V - Ke S0.
  for (int64_t n0 = 0; n0 < dv; n0 += kC) {
    const OutputQuad o(L, n0, dv);
    float acc[2][4] = {};
    o.accumulate(
        acc, 0, dk, [&](int t, int64_t i) { return w.Ke[t * dk + i]; },
        [&](int64_t i, int j) { return w.S0[i * rv + j]; });
    o.each_inside(L, dv, [&](int t, int j, int r, int c) { w.VW[t * rv + j] -= acc[r][c]; });
  }
  __syncthreads();
  // U_t = beta_t (VW_t - sum_{s < t} A_ts U_s), 16 rows at a time: the earlier rows' share for the
  // whole block of rows in parallel, then the rows within the block in order (column by column).
  for (int64_t r0 = 0; r0 < L; r0 += kSub) {
    const int64_t r1 = r0 + kSub < L ? r0 + kSub : L;
    for (int64_t idx = tid; idx < (r1 - r0) * dv; idx += nt) {
      const int64_t t = r0 + idx / dv, j = idx % dv;
      float acc = w.VW[t * rv + j];
      for (int64_t s = 0; s < r0; ++s) acc -= w.A[t * kC + s] * w.U[s * rv + j];
      w.U[t * rv + j] = acc;
    }
    __syncthreads();
    for (int64_t j = tid; j < dv; j += nt)
      for (int64_t t = r0; t < r1; ++t) {
        float acc = w.U[t * rv + j];
        for (int64_t s = r0; s < t; ++s) acc -= w.A[t * kC + s] * w.U[s * rv + j];
        w.U[t * rv + j] = w.beta[t] * acc;
      }
    __syncthreads();
  }
}

// The reverse mode of one chunk (recompute_chunk done with P): writes dv, dbeta, dg of its rows and
// this head's share of dq and dk; with carry_ds, turns w.dS from the gradient of the outgoing state
// into that of the incoming one. Ends with a barrier.
__device__ void backward_chunk(const KdaBackwardArgs& a, const HeadWork& w, int64_t h, int64_t t0,
                               int64_t L, float* dq_share, float* dk_share, int64_t share_stride,
                               bool carry_ds = true) {
  const int64_t dk = a.dk, dv = a.dv, rk = w.rk, rv = w.rv;
  const int tid = threadIdx.x, nt = blockDim.x;
  const double* gl = w.gd + (L - 1) * rk;
  for (int64_t idx = tid; idx < L * dv; idx += nt) {
    const int64_t t = idx / dv, j = idx % dv;
    w.dO[t * rv + j] = a.d_out[((t0 + t) * a.Hv + h) * dv + j];
  }
  __syncthreads();
  // dU = P^T dO + Kend dS_L, into dR: rows s, columns j. P_ts is zero for t < s, and the terms
  // from t = (the thread's first row) on add zeros to row s + 32 until t reaches it: the same bits.
  for (int64_t n0 = 0; n0 < dv; n0 += kC) {
    const OutputQuad o(L, n0, dv);
    float acc[2][4] = {};
    o.accumulate(
        acc, o.lrow[0], L, [&](int s, int64_t t) { return w.P[t * kC + s]; },
        [&](int64_t t, int j) { return w.dO[t * rv + j]; });
    o.accumulate(
        acc, 0, dk, [&](int s, int64_t i) { return w.Kend[s * dk + i]; },
        [&](int64_t i, int j) { return w.dS[i * rv + j]; });
    o.each_inside(L, dv, [&](int s, int j, int r, int c) { w.dR[s * rv + j] = acc[r][c]; });
  }
  __syncthreads();
  // dR_s = dU_s - sum_{t > s} beta_t A_ts dR_t, 16 rows at a time, last first.
  for (int64_t r0 = (L - 1) / kSub * kSub; r0 >= 0; r0 -= kSub) {
    const int64_t r1 = r0 + kSub < L ? r0 + kSub : L;
    for (int64_t idx = tid; idx < (r1 - r0) * dv; idx += nt) {
      const int64_t s = r0 + idx / dv, j = idx % dv;
      float acc = w.dR[s * rv + j];
      for (int64_t t = r1; t < L; ++t) acc -= w.beta[t] * w.A[t * kC + s] * w.dR[t * rv + j];
      w.dR[s * rv + j] = acc;
    }
    __syncthreads();
    for (int64_t j = tid; j < dv; j += nt)
      for (int64_t s = r1 - 2; s >= r0; --s) {
        float acc = w.dR[s * rv + j];
        for (int64_t t = s + 1; t < r1; ++t) acc -= w.beta[t] * w.A[t * kC + s] * w.dR[t * rv + j];
        w.dR[s * rv + j] = acc;
      }
    __syncthreads();
  }
  // dP_ts = dO_t . U_s (s <= t), dAp_ts = dR_t . U_s (s < t), into dP (P's buffer) and dA: rows t,
  // columns s.
  {
    const OutputQuad o(L, 0, L);
    float p[2][4] = {}, ap[2][4] = {};
    o.accumulate2</*kLower=*/true>(
        p, ap, 0, dv, [&](int t, int64_t j) { return w.dO[t * rv + j]; },
        [&](int t, int64_t j) { return w.dR[t * rv + j]; },
        [&](int64_t j, int s) { return w.U[s * rv + j]; });
    o.each_inside(L, L, [&](int t, int s, int r, int c) {
      w.dP[t * kC + s] = s <= t ? p[r][c] : 0.0f;
      w.dA[t * kC + s] = s < t ? ap[r][c] : 0.0f;
    });
  }
  __syncthreads();
  // dbeta_t = dR_t . VW_t - sum_{s < t} dAp_ts A_ts.
  for (int64_t t = tid; t < L; t += nt) {
    float db = 0.0f;
    for (int64_t j = 0; j < dv; ++j) db += w.dR[t * rv + j] * w.VW[t * rv + j];
    for (int64_t s = 0; s < t; ++s) db -= w.dA[t * kC + s] * w.A[t * kC + s];
    a.dbeta[(t0 + t) * a.Hv + h] = db;
  }
  __syncthreads();
  // dA = -beta dAp; dR -> beta dR, which is dv.
  for (int64_t idx = tid; idx < L * L; idx += nt) {
    const int64_t t = idx / L, s = idx % L;
    w.dA[t * kC + s] *= -w.beta[t];
  }
  for (int64_t idx = tid; idx < L * dv; idx += nt) {
    const int64_t t = idx / dv, j = idx % dv;
    const float r = w.dR[t * rv + j] * w.beta[t];
    w.dR[t * rv + j] = r;
    a.dv_out[((t0 + t) * a.Hv + h) * dv + j] = r;
  }
  __syncthreads();
  // dQe = dO S0^T, mKe = (beta dR) S0^T = -dKe (rows t, columns i), then dKend = U dS_L^T, and
  // sd_i = S0_i . dS_L,i.
  for (int64_t n0 = 0; n0 < dk; n0 += kC) {
    const OutputQuad o(L, n0, dk);
    float q[2][4] = {}, k[2][4] = {};
    o.accumulate2(
        q, k, 0, dv, [&](int t, int64_t j) { return w.dO[t * rv + j]; },
        [&](int t, int64_t j) { return w.dR[t * rv + j]; },
        [&](int64_t j, int i) { return w.S0[i * rv + j]; });
    o.each_inside(L, dk, [&](int t, int i, int r, int c) {
      w.dQe[t * dk + i] = q[r][c];
      w.mKe[t * dk + i] = k[r][c];
    });
  }
  for (int64_t n0 = 0; n0 < dk; n0 += kC) {
    const OutputQuad o(L, n0, dk);
    float e[2][4] = {};
    o.accumulate(
        e, 0, dv, [&](int t, int64_t j) { return w.U[t * rv + j]; },
        [&](int64_t j, int i) { return w.dS[i * rv + j]; });
    o.each_inside(L, dk, [&](int t, int i, int r, int c) { w.dKend[t * dk + i] = e[r][c]; });
  }
  for (int64_t i = tid; i < dk; i += nt) {
    double acc = 0.0;
    for (int64_t j = 0; j < dv; ++j) acc += double(w.S0[i * rv + j]) * w.dS[i * rv + j];
    w.sd[i] = acc;
  }
  __syncthreads();
  // dS_0 = exp(gc_L) dS_L + Qe^T dO - Ke^T (beta dR); then the pairs through A and P, by rows
  // (Qrow, Krow, rowsum of w) and by columns (Kcol, colsum of w).
  for (int64_t idx = tid; carry_ds && idx < dk * dv; idx += nt) {
    const int64_t i = idx / dv, j = idx % dv;
    float acc = exp_le0(gl[i]) * w.dS[i * rv + j];
    for (int64_t t = 0; t < L; ++t)
      acc += w.Qe[t * dk + i] * w.dO[t * rv + j] - w.Ke[t * dk + i] * w.dR[t * rv + j];
    w.dS[i * rv + j] = acc;
  }
  // By rows: (t, c) over s <= t.
  for (int64_t n0 = 0; n0 < dk; n0 += kC) {
    const OutputQuad o(L, n0, dk);
    float qt[2][4], kt[2][4], qrow[2][4] = {}, krow[2][4] = {};
    double gt[2][4], rw[2][4] = {};
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int at = o.lrow[r] * rk + o.lcol[c];
        qt[r][c] = w.Q[at];
        kt[r][c] = w.K[at];
        gt[r][c] = w.gd[at];
      }
    for (int s = 0; s <= o.lrow[1]; ++s) {
      float dp[2], da[2], ks[4];
      double gs[4];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        dp[r] = w.dP[o.lrow[r] * kC + s];
        da[r] = w.dA[o.lrow[r] * kC + s];
      }
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        ks[c] = w.K[s * rk + o.lcol[c]];
        gs[c] = w.gd[s * rk + o.lcol[c]];
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (s > o.lrow[r]) continue;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const float e = exp_le0(gt[r][c] - gs[c]);
          const float kse = ks[c] * e;
          qrow[r][c] += dp[r] * kse;
          krow[r][c] += da[r] * kse;
          if (s < o.lrow[r]) rw[r][c] += pair_term(dp[r], da[r], qt[r][c], kt[r][c], ks[c], e).w;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        if (o.inside(r, c, L, dk)) {
          const int64_t idx = o.row[r] * dk + o.col[c];
          w.qrow[idx] = qrow[r][c];
          w.krow[idx] = krow[r][c];
          w.rw[idx] = rw[r][c];
        }
  }
  // By columns: (s, c) over t >= s.
  for (int64_t n0 = 0; n0 < dk; n0 += kC) {
    const OutputQuad o(L, n0, dk);
    float ks[2][4], kcol[2][4] = {};
    double gs[2][4], cw[2][4] = {};
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int at = o.lrow[r] * rk + o.lcol[c];
        ks[r][c] = w.K[at];
        gs[r][c] = w.gd[at];
      }
    for (int t = o.lrow[0]; t < L; ++t) {
      float dp[2], da[2], qt[4], kt[4];
      double gt[4];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        dp[r] = w.dP[t * kC + o.lrow[r]];
        da[r] = w.dA[t * kC + o.lrow[r]];
      }
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        qt[c] = w.Q[t * rk + o.lcol[c]];
        kt[c] = w.K[t * rk + o.lcol[c]];
        gt[c] = w.gd[t * rk + o.lcol[c]];
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (t < o.lrow[r]) continue;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const float e = exp_le0(gt[c] - gs[r][c]);
          const PairTerm p = pair_term(dp[r], da[r], qt[c], kt[c], ks[r][c], e);
          kcol[r][c] += p.col;
          if (t > o.lrow[r]) cw[r][c] += p.w;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        if (o.inside(r, c, L, dk)) {
          const int64_t idx = o.row[r] * dk + o.col[c];
          w.kcol[idx] = kcol[r][c];
          w.cw[idx] = cw[r][c];
        }
  }
  __syncthreads();
  // dq, dk of the chunk's rows, and dg per channel:
  //   dg_u = exp(gc_L) sd + sum_{t >= u} x_t + sum_{t < u} (Kend_t dKend_t + colsum_t - rowsum_t),
  // x_t = Qe_t dQe_t + Ke_t dKe_t (Qe, Ke depend on g_u for u <= t; Kend_t for u > t).
  for (int64_t idx = tid; idx < L * dk; idx += nt) {
    const int64_t t = idx / dk, c = idx % dk;
    const double gt = w.gd[t * rk + c];
    const float eg = exp_le0(gt), eL = exp_le0(gl[c] - gt);
    const float dQ = w.qrow[idx] + w.dQe[idx] * eg;
    const float dK = w.krow[idx] + w.kcol[idx] - w.mKe[idx] * eg + w.dKend[idx] * eL;
    dq_share[(t0 + t) * share_stride + c] = dQ * a.scale;
    dk_share[(t0 + t) * share_stride + c] = dK;
  }
  for (int64_t c = tid; c < dk; c += nt) {
    double acc = double(exp_le0(gl[c])) * w.sd[c];
    for (int64_t t = 0; t < L; ++t)
      acc += double(w.Qe[t * dk + c]) * w.dQe[t * dk + c] -
             double(w.Ke[t * dk + c]) * w.mKe[t * dk + c];
    for (int64_t u = 0; u < L; ++u) {
      if (u > 0) {
        const int64_t i = (u - 1) * dk + c;
        acc += -(double(w.Qe[i]) * w.dQe[i] - double(w.Ke[i]) * w.mKe[i]) +
               double(w.Kend[i]) * w.dKend[i] + w.cw[i] - w.rw[i];
      }
      if (a.scalar_g) {
        w.dgc[u * dk + c] = acc;
      } else {
        a.dg[((t0 + u) * a.Hv + h) * dk + c] = static_cast<float>(acc);
      }
    }
  }
  __syncthreads();
  if (a.scalar_g) {
    for (int64_t u = tid; u < L; u += nt) {
      double s = 0.0;
      for (int64_t c = 0; c < dk; ++c) s += w.dgc[u * dk + c];
      a.dg[(t0 + u) * a.Hv + h] = static_cast<float>(s);
    }
    __syncthreads();
  }
}

__global__ void __launch_bounds__(kThreads) kda_chunked_backward_kernel(KdaBackwardArgs all) {
  // Block (h, s): value head h of sequence s. The shares of dq and dk span every row of the launch
  // (the head sum runs over them all), so their pointers move to the sequence's first row here.
  const int64_t h = blockIdx.x, s = blockIdx.y, blk = s * all.Hv + h;
  const int64_t row0 = all.cu_seqlens != nullptr ? all.cu_seqlens[s] : 0;
  const KdaBackwardArgs a = sequence_args(all, s);
  const int64_t dk = a.dk, dv = a.dv, area = dk * dv, n = chunks_of(a.T);
  const int tid = threadIdx.x, nt = blockDim.x;
  const HeadWork w = head_work(all, blk);  // unpadded (rk = dk, rv = dv): states are contiguous
  float* ckpt = head_ckpt(all, blk);
  const bool direct = a.Hv == a.Hk;  // each value head owns its key head's rows of dq and dk
  float* shares = shares_base(all);
  float* dq_share = direct ? a.dq + h * dk : shares + (h * all.T + row0) * dk;
  float* dk_share = direct ? a.dk_out + h * dk : shares + ((a.Hv + h) * all.T + row0) * dk;
  const int64_t share_stride = direct ? a.Hk * dk : dk;
  // The boundary pass: the state before every chunk.
  for (int64_t idx = tid; idx < area; idx += nt)
    w.S0[idx] = a.s0 != nullptr ? a.s0[h * area + idx] : 0.0f;
  __syncthreads();
  for (int64_t c = 0; c + 1 < n; ++c) {
    const int64_t t0 = c * kC, L = t0 + kC < a.T ? kC : a.T - t0;
    for (int64_t idx = tid; idx < area; idx += nt) ckpt[c * area + idx] = w.S0[idx];
    recompute_chunk(a, w, h, t0, L, /*want_p=*/false);
    // S0 <- exp(gc_L) S0 + Kend^T U.
    const double* gl = w.gd + (L - 1) * w.rk;
    for (int64_t idx = tid; idx < area; idx += nt) {
      const int64_t i = idx / dv, j = idx % dv;
      float acc = exp_le0(gl[i]) * w.S0[idx];
      for (int64_t t = 0; t < L; ++t) acc += w.Kend[t * dk + i] * w.U[t * w.rv + j];
      w.S0[idx] = acc;
    }
    __syncthreads();
  }
  if (n > 0)
    for (int64_t idx = tid; idx < area; idx += nt) ckpt[(n - 1) * area + idx] = w.S0[idx];
  for (int64_t idx = tid; idx < area; idx += nt)
    w.dS[idx] = a.d_final != nullptr ? a.d_final[h * area + idx] : 0.0f;
  __syncthreads();
  for (int64_t c = n - 1; c >= 0; --c) {
    const int64_t t0 = c * kC, L = t0 + kC < a.T ? kC : a.T - t0;
    for (int64_t idx = tid; idx < area; idx += nt) w.S0[idx] = ckpt[c * area + idx];
    __syncthreads();
    recompute_chunk(a, w, h, t0, L, /*want_p=*/true);
    backward_chunk(a, w, h, t0, L, dq_share, dk_share, share_stride);
  }
  if (a.d_s0 != nullptr)
    for (int64_t idx = tid; idx < area; idx += nt) a.d_s0[h * area + idx] = w.dS[idx];
}

// dq, dk [T, Hk, dk]: the value heads' shares summed per key head in head order.
__global__ void __launch_bounds__(256)
    kda_chunked_backward_sum_heads_kernel(KdaBackwardArgs a, const float* shares) {
  const int64_t n = a.T * a.Hk * a.dk, group = a.Hv / a.Hk;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
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

// ---- the chunk-parallel form -------------------------------------------------------------------
// For the shapes the forward's chunked kernels take (kda_chunked_supported), three passes instead
// of one block walking its sequence:
//  1. the forward's preparation and state pass (kernels/cuda/kda_chunked.cu, f32, rmax 0), which
//     keep the state before every chunk (state_before) and leave W, QG, KG, P and the decays of
//     every chunk in their workspace; the output itself is not written;
//  2. kda_chunked_state_backward: the state pass in reverse, the gradient of the state after every
//     chunk (and of the initial state);
//  3. every (chunk, value head) at once: recompute_chunk from its state and backward_chunk with its
//     state gradient given (no dS carried), on a persistent grid of as many blocks as are resident
//     together, each with its own chunk buffers.
// Each pass works per chunk or per sequence, so a packed launch still gives each sequence the bits
// of a launch of its own.

// Where the chunk-parallel form keeps things in a.scratch (offsets in floats, each region starting
// on a 256-byte boundary). nb bounds the number of chunks (the forward's chunk_bound).
struct ParallelLayout {
  bool shared;  // the gradient kernel's row tiles in shared memory
  int64_t blocks, nb, work, shares, states, d_states, pool, cu, slots, fwd, total;
};

__host__ inline int64_t round64(int64_t n) { return (n + 63) / 64 * 64; }

launch::KdaVarlenArgs forward_args(const KdaBackwardArgs& a) {
  launch::KdaVarlenArgs f;
  f.q = a.q;
  f.k = a.k;
  f.v = a.v;
  f.g = a.g;
  f.beta = a.beta;
  f.scale = a.scale;
  f.B = a.num_seqs;
  f.N = a.T;
  f.num_slots = a.num_seqs;
  f.Hk = static_cast<int>(a.Hk);
  f.Hv = static_cast<int>(a.Hv);
  f.dk = static_cast<int>(a.dk);
  f.dv = static_cast<int>(a.dv);
  f.scalar_g = a.scalar_g;
  return f;
}

// kRowTilesShared: the row tiles in dynamic shared memory (padded strides; one block an SM), the
// rest of the chunk buffers in global scratch; otherwise all of them in global scratch.
template <bool kRowTilesShared>
__global__ void __launch_bounds__(kThreads, 1)
    kda_chunk_gradient_kernel(KdaBackwardArgs all, const int32_t* off, const int64_t* cu,
                              const float* states, const float* d_states, float* shares) {
  extern __shared__ float4 smem_f4[];
  const int64_t dk = all.dk, dv = all.dv, area = dk * dv;
  const int tid = threadIdx.x, nt = blockDim.x;
  HeadWork w;
  if constexpr (kRowTilesShared) {
    Carver sc{reinterpret_cast<float*>(smem_f4)};
    carve_row_tiles(w, sc, dk, dk + 1, dv + 1);
    Carver gc{all.scratch + blockIdx.x * head_work_floats(dk, dv, true)};
    carve_global_tiles(w, gc, dk);
  } else {
    w = head_work(all, blockIdx.x);
  }
  const int64_t items = static_cast<int64_t>(off[all.num_seqs]) * all.Hv;
  const bool direct = all.Hv == all.Hk;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t ci = item / all.Hv, h = item - ci * all.Hv;
    int64_t s = 0, hi = all.num_seqs;  // the sequence: off[s] <= ci < off[s + 1]
    while (hi - s > 1) {
      const int64_t mid = (s + hi) / 2;
      if (off[mid] <= ci) {
        s = mid;
      } else {
        hi = mid;
      }
    }
    const KdaBackwardArgs a = sequence_args(all, s);
    const int64_t row0 = cu[s], t0 = (ci - off[s]) * kC, L = t0 + kC < a.T ? kC : a.T - t0;
    float* dq_share = direct ? a.dq + h * dk : shares + (h * all.T + row0) * dk;
    float* dk_share = direct ? a.dk_out + h * dk : shares + ((a.Hv + h) * all.T + row0) * dk;
    const int64_t share_stride = direct ? a.Hk * dk : dk;
    for (int64_t idx = tid; idx < area; idx += nt) {
      const int64_t r = (idx / dv) * w.rv + idx % dv;
      w.S0[r] = states[(ci * all.Hv + h) * area + idx];
      w.dS[r] = d_states[(ci * all.Hv + h) * area + idx];
    }
    __syncthreads();
    recompute_chunk(a, w, h, t0, L, /*want_p=*/true);
    backward_chunk(a, w, h, t0, L, dq_share, dk_share, share_stride, /*carry_ds=*/false);
  }
}

// The forward's inputs that the backward's arguments do not hold: row offsets {0, T} for one
// sequence, slot b for sequence b, and the initial states (s0, or zero) in a pool that the
// forward's state pass may update.
__global__ void kda_backward_setup_kernel(KdaBackwardArgs a, int64_t* cu, int32_t* slots,
                                          float* pool) {
  const int64_t n = a.num_seqs * a.Hv * a.dk * a.dv;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = i0; i < n; i += stride) pool[i] = a.s0 != nullptr ? a.s0[i] : 0.0f;
  for (int64_t b = i0; b < a.num_seqs; b += stride) slots[b] = static_cast<int32_t>(b);
  if (cu != nullptr && i0 == 0) {
    cu[0] = 0;
    cu[1] = a.T;
  }
}

// Whether the row tiles go to shared memory: when they fit one block's opt-in limit (dk, dv <= 64
// with the padding; 211 KB at 64 x 64).
bool row_tiles_shared(const KdaBackwardArgs& a) {
  int device = 0, limit = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&device));
  LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return shared_row_tile_bytes(a.dk, a.dv) <= static_cast<size_t>(limit);
}

// Blocks of the gradient kernel resident at once (which also raises its shared-memory limit).
int64_t resident_gradient_blocks(const KdaBackwardArgs& a, bool shared) {
  if (shared)
    return launch::resident_blocks(reinterpret_cast<const void*>(&kda_chunk_gradient_kernel<true>),
                                   kThreads, shared_row_tile_bytes(a.dk, a.dv));
  return launch::resident_blocks(reinterpret_cast<const void*>(&kda_chunk_gradient_kernel<false>),
                                 kThreads, 0);
}

ParallelLayout parallel_layout(const KdaBackwardArgs& a) {
  ParallelLayout l{};
  l.nb = a.T / kC + a.num_seqs;
  const int64_t area = a.dk * a.dv;
  l.shared = row_tiles_shared(a);
  l.blocks = std::min<int64_t>(l.nb * a.Hv, resident_gradient_blocks(a, l.shared));
  int64_t at = 0;
  const auto take = [&](int64_t floats) {
    const int64_t r = at;
    at += round64(floats);
    return r;
  };
  l.work = take(l.blocks * head_work_floats(a.dk, a.dv, l.shared));
  l.shares = take(a.Hv == a.Hk ? 0 : 2 * a.Hv * a.T * a.dk);
  l.states = take(l.nb * a.Hv * area);
  l.d_states = take(l.nb * a.Hv * area);
  l.pool = take(a.num_seqs * a.Hv * area);
  l.cu = take(a.cu_seqlens == nullptr ? 4 : 0);
  l.slots = take((a.num_seqs + 1) / 2);
  l.fwd = take(static_cast<int64_t>(
      (launch::kda_chunked_workspace_bytes(forward_args(a)) + sizeof(float) - 1) / sizeof(float)));
  l.total = at;
  return l;
}

void run_parallel(cudaStream_t stream, const KdaBackwardArgs& a) {
  const ParallelLayout l = parallel_layout(a);
  float* base = a.scratch;
  int64_t* cu = a.cu_seqlens == nullptr ? reinterpret_cast<int64_t*>(base + l.cu) : nullptr;
  int32_t* slots = reinterpret_cast<int32_t*>(base + l.slots);
  kda_backward_setup_kernel<<<dev::grid_for(a.num_seqs * a.Hv * a.dk * a.dv, 256), 256, 0,
                              stream>>>(a, cu, slots, base + l.pool);
  LOOM_CUDA_CHECK_LAUNCH();
  launch::KdaVarlenArgs f = forward_args(a);
  f.out = nullptr;
  f.pool = base + l.pool;
  f.slots = slots;
  f.cu = cu != nullptr ? cu : a.cu_seqlens;
  f.state_before = base + l.states;
  void* fwd = base + l.fwd;
  launch::kda_chunked_varlen(stream, f, /*rmax=*/0, fwd);
  launch::kda_chunked_state_backward(stream, f, fwd, a.d_out, a.d_final, base + l.d_states, a.d_s0);
  const int32_t* table = launch::kda_chunked_chunk_table(fwd);
  const unsigned blocks = static_cast<unsigned>(l.blocks);
  if (l.shared) {
    kda_chunk_gradient_kernel<true>
        <<<blocks, kThreads, shared_row_tile_bytes(a.dk, a.dv), stream>>>(
            a, table, f.cu, base + l.states, base + l.d_states, base + l.shares);
  } else {
    kda_chunk_gradient_kernel<false><<<blocks, kThreads, 0, stream>>>(
        a, table, f.cu, base + l.states, base + l.d_states, base + l.shares);
  }
  LOOM_CUDA_CHECK_LAUNCH();
  const int64_t n = a.T * a.Hk * a.dk;
  if (a.Hv != a.Hk && n > 0) {
    kda_chunked_backward_sum_heads_kernel<<<dev::grid_for(n, 256), 256, 0, stream>>>(
        a, base + l.shares);
    LOOM_CUDA_CHECK_LAUNCH();
  }
}

// The forward's kernels take this shape and these pointers (the size checks first keep the int
// fields of KdaVarlenArgs from overflowing).
bool takes_parallel_form(const KdaBackwardArgs& a) {
  if (a.T == 0) return false;
  if (a.Hv > INT32_MAX || a.dk > 128 || a.dv > 128) return false;
  return launch::kda_chunked_supported(forward_args(a));
}

}  // namespace

namespace launch {

int64_t kda_chunked_backward_scratch_floats(const KdaBackwardArgs& a) {
  if (takes_parallel_form(a)) return parallel_layout(a).total;
  const int64_t shares = a.Hv == a.Hk ? 0 : 2 * a.Hv * a.T * a.dk;
  return a.num_seqs * a.Hv *
             (head_work_floats(a.dk, a.dv, false) + chunks_of(a.max_T) * a.dk * a.dv) +
         shares;
}

void kda_chunked_backward(cudaStream_t stream, const KdaBackwardArgs& a) {
  if (a.Hv == 0 || a.num_seqs == 0) return;
  if (takes_parallel_form(a)) {
    run_parallel(stream, a);
    return;
  }
  const dim3 grid(static_cast<unsigned>(a.Hv), static_cast<unsigned>(a.num_seqs));
  kda_chunked_backward_kernel<<<grid, kThreads, 0, stream>>>(a);
  LOOM_CUDA_CHECK_LAUNCH();
  const int64_t n = a.T * a.Hk * a.dk;
  if (a.Hv != a.Hk && n > 0) {
    kda_chunked_backward_sum_heads_kernel<<<dev::grid_for(n, 256), 256, 0, stream>>>(
        a, shares_base(a));
    LOOM_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace launch
}  // namespace loom::cuda
