// The chunked (WY/UT) backward of the delta rule on the CPU.
//
// Per value head and chunk of L <= kKdaChunk tokens with incoming state S0, in the notation of the
// chunked forward (kernels/cpu/kda.cc): gc_t = sum_{u <= t} g_u inside the chunk, E_ts =
// exp(gc_t - gc_s) <= 1 for s <= t, Q = scale q, Qe = Q exp(gc), Ke = K exp(gc),
// Kend_s = K_s exp(gc_L - gc_s), A_ts = sum_c K_tc K_sc E_ts,c (s < t),
// P_ts = sum_c Q_tc K_sc E_ts,c (s <= t), Ap = -diag(beta) A, and
//   VW = V - Ke S0,   U = beta VW + Ap U   (forward substitution),
//   O  = Qe S0 + P U, S_L = exp(gc_L) S0 + Kend^T U.
// Given dO and dS_L, the reverse mode is
//   dU  = P^T dO + Kend dS_L,          dR = (I - Ap)^{-T} dU   (backward substitution),
//   dAp = dR U^T (s < t),               dP = dO U^T (s <= t),
//   dv  = beta dR,  dbeta_t = dR_t . VW_t - sum_s dAp_ts A_ts,   dA_ts = -beta_t dAp_ts,
//   [dQe; -dKe] = [dO; beta dR] S0^T,  dKend = U dS_L^T,
//   dS0 = exp(gc_L) dS_L + Qe^T dO - Ke^T (beta dR),
// and through A and P (E as above):
//   Qrow_t = sum_s dP_ts K_s E_ts,  Krow_t = sum_s dA_ts K_s E_ts,
//   Kcol_s = sum_t (dP_ts Q_t + dA_ts K_t) E_ts,
//   dQ = Qrow + dQe exp(gc),  dK = Krow + Kcol + dKe exp(gc) + dKend exp(gc_L - gc),
// and, with dg_u = sum_{t >= u} dgc_t inside the chunk (summed over channels for GDN),
//   dgc = Q Qrow + K (Krow - Kcol) + Qe dQe + Ke dKe - Kend dKend
//         (+ at t = L - 1: exp(gc_L) rowsum(S0 dS_L) + sum_s Kend_s dKend_s),
// which backward_chunk sums per pair rather than per token, for accuracy (see there).
//
// Memory: a first pass runs the chunked forward per head and keeps only the state before each
// chunk; the backward pass then goes over the chunks last first, recomputing each chunk's A, P
// and U from its stored state. Nothing per token of size dk x dv is ever kept.
//
// Exponentials, as the forward's safeguards demand: in the backward pass every factor is exp of a
// difference <= 0. Blocks of 16 rows against earlier sub-chunks factor E_ts through the rows'
// sub-chunk start r0 (exp(gc_t - gc_r0) and exp(gc_r0 - gc_s), both <= 1), which makes them GEMMs.
// In the backward pass the 16x16 diagonal blocks are formed element by element (exp(gc_t - gc_s)
// per pair, kept for the chunk's reverse mode): the forward may factor them with growing factors up
// to e^80 because it only multiplies inputs of order one by them, but here a factor of e^-80 would
// meet gradients of any scale and could leave the f32 range. Only the boundary pass, which builds A
// from unit-norm keys alone, factorises them as the forward does (when the block decays by at most
// 80 nats). The diagonal blocks cost 8.5 pairs per token, each dk exponentials, once.
#include "kernels/cpu/kda_chunked_backward.h"

#include <algorithm>
#include <cstring>

#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "kernels/cpu/kda_backward.h"
#include "kernels/cpu/kda_simd.h"
#include "kernels/kda.h"

namespace loom::cpu {
namespace {

using namespace kda_simd;  // NOLINT(google-build-using-namespace): this family's own helpers

constexpr int64_t kC = kKdaChunk;
constexpr int64_t kSub = 16;
constexpr int64_t kPairs = kSub * (kSub + 1) / 2;  // pairs s <= t of one diagonal block

// Where the pair (t, s), s <= t, of the diagonal block starting at r0 keeps its factors in Ed.
inline int64_t pair_index(int64_t r0, int64_t t, int64_t s) {
  return r0 / kSub * kPairs + (t - r0) * (t - r0 + 1) / 2 + (s - r0);
}

// The chunked forward's bound (kernels/cpu/kda.cc): a diagonal block whose channels all decay by at
// most this many nats may be factorised through its first token, every factor within e^+-80.
// Only the boundary pass does, where the factors meet unit-norm keys alone, as in the forward.
constexpr double kMaxFactorSpan = 80.0;

struct Dims {
  int64_t T, Hk, Hv, dk, dv, Kp, Vp;
  bool scalar_g;
  int64_t chunks() const { return (T + kC - 1) / kC; }
};

// One thread's chunk buffers, carved from the scratch tensor. Rows are padded to multiples of 8
// with zeros (Kp, Vp), so every GEMM sees n % 8 == 0 and padding contributes nothing.
struct ChunkBuffers {
  double* gd;    // [C, Kp] cumulative decay (f64: exponents are differences of these)
  double* gdT;   // [Kp, C]
  float* Q;      // [C, Kp] scale * q
  float* K;      // [C, Kp]
  float* KT;     // [Kp, C]
  float* QK;     // [2C, Kp] rows [0, L): Qe; rows [L, 2L): -Ke
  float* Kend;   // [C, Kp]
  float* A;      // [C, C] A (strictly lower)
  float* Ap;     // [C, C] -beta_t A_ts
  float* P;      // [C, C]
  float* VW;     // [C, Vp] V - Ke S0
  float* U;      // [C, Vp]
  float* UT;     // [Vp, C]
  float* DOB;    // [2C, Vp] rows [0, L): dO; rows [L, 2L): dU, then dR, then beta dR
  float* DPA;    // [2C, C] rows [0, L): dP; rows [L, 2L): dAp, then dA
  float* M;      // [2C, Kp] [dQe; -dKe]
  float* dKend;  // [C, Kp]
  float* Qrow;   // [C, Kp]
  float* Krow;   // [C, Kp]
  float* Kcol;   // [C, Kp]
  float* Er;     // [C, Kp] exp(gc_r0 - gc_s) for s < r0
  float* Kr;     // [C, Kp] K exp(gc_r0 - gc_s)
  float* KrT;    // [Kp, C]
  float* dKr;    // [C, Kp]
  float* En;     // [16, Kp] exp(gc_t - gc_r0) for the rows of one sub-chunk
  float* Qn;     // [16, Kp]
  float* Kn;     // [16, Kp]
  float* tq;     // [16, Kp]
  float* tk;     // [16, Kp]
  float* S0;     // [Kp, Vp] the chunk's incoming state
  float* S0T;    // [Vp, Kp]
  float* dS;     // [Kp, Vp] the gradient of the chunk's outgoing state, then incoming
  float* dST;    // [Vp, Kp]
  double* D;     // [C + 1, Kp] dg's difference array: dg_u = sum_{j <= u} D_j (backward_chunk)
  double* tot;   // [Kp]
  float* Ed;     // [C / 16 * kPairs, Kp] exp(gc_t - gc_s) of each diagonal block's pairs s <= t
};

// Every region starts on a 64-byte boundary (16 floats).
inline int64_t pad16(int64_t n) { return (n + 15) / 16 * 16; }

// dst[j * ldd + i] = src[i * lds + j] for i < rows, j < cols (both multiples of 8), in 8x8 tiles.
template <typename T>
void transpose(int64_t rows, int64_t cols, const T* src, int64_t lds, T* dst, int64_t ldd) {
  for (int64_t i0 = 0; i0 < rows; i0 += 8)
    for (int64_t j0 = 0; j0 < cols; j0 += 8)
      for (int64_t i = i0; i < i0 + 8; ++i)
        for (int64_t j = j0; j < j0 + 8; ++j) dst[j * ldd + i] = src[i * lds + j];
}

// p[0 .. 8) += w, in f64.
inline void add8d(double* p, v8 w) {
  const v4f lo = __builtin_shufflevector(w, w, 0, 1, 2, 3),
            hi = __builtin_shufflevector(w, w, 4, 5, 6, 7);
  v4d a, b;
  std::memcpy(&a, p, sizeof(a));
  std::memcpy(&b, p + 4, sizeof(b));
  a += __builtin_convertvector(lo, v4d);
  b += __builtin_convertvector(hi, v4d);
  std::memcpy(p, &a, sizeof(a));
  std::memcpy(p + 4, &b, sizeof(b));
}

// Carves (or, with base == nullptr, only measures) one thread's buffers; returns the floats used.
int64_t carve(int64_t Kp, int64_t Vp, float* base, ChunkBuffers* b) {
  int64_t off = 0;
  auto take = [&](int64_t floats) {
    float* p = base ? base + off : nullptr;
    off += pad16(floats);
    return p;
  };
  auto take_d = [&](int64_t doubles) { return reinterpret_cast<double*>(take(2 * doubles)); };
  ChunkBuffers c{};
  c.gd = take_d(kC * Kp);
  c.gdT = take_d(Kp * kC);
  c.D = take_d((kC + 1) * Kp);
  c.tot = take_d(Kp);
  c.Ed = take(kC / kSub * kPairs * Kp);
  c.Q = take(kC * Kp);
  c.K = take(kC * Kp);
  c.KT = take(Kp * kC);
  c.QK = take(2 * kC * Kp);
  c.Kend = take(kC * Kp);
  c.A = take(kC * kC);
  c.Ap = take(kC * kC);
  c.P = take(kC * kC);
  c.VW = take(kC * Vp);
  c.U = take(kC * Vp);
  c.UT = take(Vp * kC);
  c.DOB = take(2 * kC * Vp);
  c.DPA = take(2 * kC * kC);
  c.M = take(2 * kC * Kp);
  c.dKend = take(kC * Kp);
  c.Qrow = take(kC * Kp);
  c.Krow = take(kC * Kp);
  c.Kcol = take(kC * Kp);
  c.Er = take(kC * Kp);
  c.Kr = take(kC * Kp);
  c.KrT = take(Kp * kC);
  c.dKr = take(kC * Kp);
  c.En = take(kSub * Kp);
  c.Qn = take(kSub * Kp);
  c.Kn = take(kSub * Kp);
  c.tq = take(kSub * Kp);
  c.tk = take(kSub * Kp);
  c.S0 = take(Kp * Vp);
  c.S0T = take(Vp * Kp);
  c.dS = take(Kp * Vp);
  c.dST = take(Vp * Kp);
  if (b) *b = c;
  return off;
}

// Flushes subnormal f32 results and operands to zero on this thread while in scope (x86 MXCSR
// FTZ and DAZ). Decayed keys and queries (K exp(gc) after 35 bounded-gate tokens, say) and their
// products fall below 1.2e-38 routinely, and every GEMM operation on a subnormal takes a
// microcode assist of ~100 cycles: measured 3.4x slower over the whole backward (T 1024, d 128).
// What is flushed is below 1e-38 relative to the O(1) terms it is summed with.
class FlushSubnormals {
 public:
#if defined(__SSE__)
  FlushSubnormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040); }
  ~FlushSubnormals() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
#endif
};

int thread_count(int64_t Hv) {
#ifdef _OPENMP
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(omp_get_max_threads(), Hv)));
#else
  (void)Hv;
  return 1;
#endif
}

struct Inputs {
  const float *q, *k, *v, *g, *beta, *d_out;
  float scale;
};

// Where value head h writes its share of dq and dk: row t at base + t * stride.
struct Share {
  float *dq, *dk;
  int64_t stride;
};

// Loads chunk [t0, t0 + L) of value head h and recomputes its forward from the incoming state
// b.S0: gd, Q, K (and transposes), QK, A, Ap, P (when want_p), VW, U and Kend.
void recompute_chunk(const Dims& d, const Inputs& in, int64_t h, int64_t t0, int64_t L, bool want_p,
                     const ChunkBuffers& b) {
  const int64_t Kp = d.Kp, Vp = d.Vp, dk = d.dk, dv = d.dv, Lp = round_up8(L);
  const int64_t hk = h / (d.Hv / d.Hk), gw = d.scalar_g ? 1 : dk;
  for (int64_t t = 0; t < L; ++t) {
    const int64_t tt = t0 + t;
    const float* qs = in.q + (tt * d.Hk + hk) * dk;
    const float* ks = in.k + (tt * d.Hk + hk) * dk;
    const float* gs = in.g + (tt * d.Hv + h) * gw;
    float* qr = b.Q + t * Kp;
    float* kr = b.K + t * Kp;
    double* gr = b.gd + t * Kp;
    std::fill(qr, qr + Kp, 0.0f);
    std::fill(kr, kr + Kp, 0.0f);
    std::fill(gr, gr + Kp, 0.0);
    for (int64_t c = 0; c < dk; ++c) {
      qr[c] = qs[c] * in.scale;
      kr[c] = ks[c];
      gr[c] = gs[d.scalar_g ? 0 : c];
    }
    if (t > 0)
      for (int64_t c = 0; c < dk; ++c) gr[c] += gr[c - Kp];
    float* vr = b.VW + t * Vp;
    std::memcpy(vr, in.v + (tt * d.Hv + h) * dv, dv * sizeof(float));
    std::fill(vr + dv, vr + Vp, 0.0f);
  }
  // Rows L .. Lp zero, then the transposes (columns L .. Lp of KT zero, of gdT finite).
  std::fill(b.K + L * Kp, b.K + Lp * Kp, 0.0f);
  std::fill(b.gd + L * Kp, b.gd + Lp * Kp, 0.0);
  transpose(Lp, Kp, b.K, Kp, b.KT, kC);
  transpose(Lp, Kp, b.gd, Kp, b.gdT, kC);
  float* Qe = b.QK;
  float* Ken = b.QK + L * Kp;
  for (int64_t t = 0; t < L; ++t)
    for (int64_t c = 0; c < Kp; c += 8) {
      const v8 e = exp8d(b.gd + t * Kp + c);
      st8(Qe + t * Kp + c, ld8(b.Q + t * Kp + c) * e);
      st8(Ken + t * Kp + c, -ld8(b.K + t * Kp + c) * e);
    }
  std::fill(b.A, b.A + kC * kC, 0.0f);
  if (want_p) std::fill(b.P, b.P + kC * kC, 0.0f);
  for (int64_t r0 = 0; r0 < L; r0 += kSub) {
    const int64_t r1 = std::min(L, r0 + kSub), nr = r1 - r0;
    const double* gref = b.gd + r0 * Kp;
    const double* glast = b.gd + (r1 - 1) * Kp;
    // The boundary pass (A only) factorises the diagonal block too where the forward would.
    bool factor_diag = !want_p;
    for (int64_t c = 0; c < dk && factor_diag; ++c)
      factor_diag = gref[c] - glast[c] <= kMaxFactorSpan;
    // Earlier sub-chunks (and a factorised diagonal block) through the reference point r0: rows
    // decayed to it (factors <= 1), keys from it back to s (<= 1 for s <= r0, <= e^80 after).
    const int64_t ns = factor_diag ? round_up8(r1) : r0;
    if (ns > 0) {
      for (int64_t t = r0; t < r1; ++t)
        for (int64_t c = 0; c < Kp; c += 8) {
          const v8 e = exp_diff8(b.gd + t * Kp + c, gref + c);
          st8(b.Qn + (t - r0) * Kp + c, ld8(b.Q + t * Kp + c) * e);
          st8(b.Kn + (t - r0) * Kp + c, ld8(b.K + t * Kp + c) * e);
        }
      for (int64_t c = 0; c < dk; ++c)
        for (int64_t s = 0; s < ns; s += 8)
          st8(b.KrT + c * kC + s, ld8(b.KT + c * kC + s) * exp_diff8s(gref[c], b.gdT + c * kC + s));
      for (int64_t c = dk; c < Kp; ++c) std::fill(b.KrT + c * kC, b.KrT + c * kC + ns, 0.0f);
      gemm_acc(nr, ns, Kp, b.Kn, Kp, 1, b.KrT, kC, b.A + r0 * kC, kC);
      if (want_p) gemm_acc(nr, ns, Kp, b.Qn, Kp, 1, b.KrT, kC, b.P + r0 * kC, kC);
    }
    if (factor_diag) {
      // Drop what the block product put on or above the diagonal.
      for (int64_t t = r0; t < r1; ++t) std::fill(b.A + t * kC + t, b.A + t * kC + ns, 0.0f);
      continue;
    }
    // The diagonal block, exp(gc_t - gc_s) <= 1 element by element; the backward pass keeps the
    // factors for backward_chunk.
    for (int64_t t = r0; t < r1; ++t)
      for (int64_t s = r0; s <= t; ++s) {
        float* ed = b.Ed + pair_index(r0, t, s) * Kp;
        v8 sa = v8{}, sp = v8{};
        for (int64_t c = 0; c < Kp; c += 8) {
          const v8 e = exp_diff8(b.gd + t * Kp + c, b.gd + s * Kp + c);
          if (want_p) st8(ed + c, e);
          const v8 kse = ld8(b.K + s * Kp + c) * e;
          sa += ld8(b.K + t * Kp + c) * kse;
          sp += ld8(b.Q + t * Kp + c) * kse;
        }
        if (s < t) b.A[t * kC + s] = hsum8(sa);
        if (want_p) b.P[t * kC + s] = hsum8(sp);
      }
  }
  // VW = V - Ke S0; U = beta VW, then U_t += sum_{s<t} Ap_ts U_s (blocked as the forward).
  gemm_acc(L, Vp, Kp, Ken, Kp, 1, b.S0, Vp, b.VW, Vp);
  for (int64_t t = 0; t < L; ++t) {
    const float bt = in.beta[(t0 + t) * d.Hv + h];
    for (int64_t s = 0; s < kC; ++s) b.Ap[t * kC + s] = s < t ? -bt * b.A[t * kC + s] : 0.0f;
    for (int64_t c = 0; c < Vp; c += 8) st8(b.U + t * Vp + c, ld8(b.VW + t * Vp + c) * bt);
  }
  for (int64_t r0 = 0; r0 < L; r0 += kSub) {
    const int64_t r1 = std::min(L, r0 + kSub);
    gemm_acc(r1 - r0, Vp, r0, b.Ap + r0 * kC, kC, 1, b.U, Vp, b.U + r0 * Vp, Vp);
    for (int64_t t = r0 + 1; t < r1; ++t)
      for (int64_t s = r0; s < t; ++s) {
        const v8 a = splat8(b.Ap[t * kC + s]);
        for (int64_t c = 0; c < Vp; c += 8)
          st8(b.U + t * Vp + c, ld8(b.U + t * Vp + c) + a * ld8(b.U + s * Vp + c));
      }
  }
  const double* gl = b.gd + (L - 1) * Kp;
  for (int64_t s = 0; s < L; ++s)
    for (int64_t c = 0; c < Kp; c += 8)
      st8(b.Kend + s * Kp + c, ld8(b.K + s * Kp + c) * exp_diff8(gl + c, b.gd + s * Kp + c));
}

// The backward of one chunk (recompute_chunk done, with P): writes dv, dbeta, dg of its rows and
// this head's share of dq, dk; turns b.dS from the gradient of the outgoing state into that of
// the incoming one.
void backward_chunk(const Dims& d, const Inputs& in, int64_t h, int64_t t0, int64_t L,
                    const Share& share, float* dv_out, float* dg_out, float* dbeta_out,
                    const ChunkBuffers& b) {
  const int64_t Kp = d.Kp, Vp = d.Vp, dk = d.dk, dv = d.dv, Lp = round_up8(L);
  const int64_t gw = d.scalar_g ? 1 : dk;
  float* dO = b.DOB;
  float* dR = b.DOB + L * Vp;
  float* dP = b.DPA;
  float* dA = b.DPA + L * kC;
  for (int64_t t = 0; t < L; ++t) {
    float* r = dO + t * Vp;
    std::memcpy(r, in.d_out + ((t0 + t) * d.Hv + h) * dv, dv * sizeof(float));
    std::fill(r + dv, r + Vp, 0.0f);
  }
  // dU = P^T dO + Kend dS_L (rows s of P^T need t >= s only).
  std::fill(dR, dR + L * Vp, 0.0f);
  gemm_acc(L, Vp, Kp, b.Kend, Kp, 1, b.dS, Vp, dR, Vp);
  for (int64_t r0 = 0; r0 < L; r0 += kSub) {
    const int64_t nr = std::min(L, r0 + kSub) - r0;
    gemm_acc(nr, Vp, L - r0, b.P + r0 * kC + r0, 1, kC, dO + r0 * Vp, Vp, dR + r0 * Vp, Vp);
  }
  // dR_s = dU_s + sum_{t>s} Ap_ts dR_t, sub-chunks last first.
  for (int64_t r0 = (L - 1) / kSub * kSub; r0 >= 0; r0 -= kSub) {
    const int64_t r1 = std::min(L, r0 + kSub);
    gemm_acc(r1 - r0, Vp, L - r1, b.Ap + r1 * kC + r0, 1, kC, dR + r1 * Vp, Vp, dR + r0 * Vp, Vp);
    for (int64_t s = r1 - 2; s >= r0; --s)
      for (int64_t t = s + 1; t < r1; ++t) {
        const v8 a = splat8(b.Ap[t * kC + s]);
        for (int64_t c = 0; c < Vp; c += 8)
          st8(dR + s * Vp + c, ld8(dR + s * Vp + c) + a * ld8(dR + t * Vp + c));
      }
  }
  // [dP; dAp] = [dO; dR] U^T.
  std::fill(b.U + L * Vp, b.U + Lp * Vp, 0.0f);
  transpose(Lp, Vp, b.U, Vp, b.UT, kC);
  std::fill(b.DPA, b.DPA + 2 * L * kC, 0.0f);
  gemm_acc(2 * L, Lp, Vp, b.DOB, Vp, 1, b.UT, kC, b.DPA, kC);
  // dbeta; dA = -beta dAp (s < t); dP masked to s <= t; dR -> beta dR = dv.
  for (int64_t t = 0; t < L; ++t) {
    const float bt = in.beta[(t0 + t) * d.Hv + h];
    v8 acc = v8{};
    for (int64_t c = 0; c < Vp; c += 8) acc += ld8(dR + t * Vp + c) * ld8(b.VW + t * Vp + c);
    float db = hsum8(acc);
    for (int64_t s = 0; s < t; ++s) {
      const float da = dA[t * kC + s];
      db -= da * b.A[t * kC + s];
      dA[t * kC + s] = -bt * da;
    }
    std::fill(dA + t * kC + t, dA + (t + 1) * kC, 0.0f);
    std::fill(dP + t * kC + t + 1, dP + (t + 1) * kC, 0.0f);
    dbeta_out[(t0 + t) * d.Hv + h] = db;
    for (int64_t c = 0; c < Vp; c += 8) st8(dR + t * Vp + c, ld8(dR + t * Vp + c) * bt);
    std::memcpy(dv_out + ((t0 + t) * d.Hv + h) * dv, dR + t * Vp, dv * sizeof(float));
  }
  // [dQe; -dKe] = [dO; beta dR] S0^T and dKend = U dS_L^T.
  transpose(Kp, Vp, b.S0, Vp, b.S0T, Kp);
  transpose(Kp, Vp, b.dS, Vp, b.dST, Kp);
  std::fill(b.M, b.M + 2 * L * Kp, 0.0f);
  gemm_acc(2 * L, Kp, Vp, b.DOB, Vp, 1, b.S0T, Kp, b.M, Kp);
  std::fill(b.dKend, b.dKend + L * Kp, 0.0f);
  gemm_acc(L, Kp, Vp, b.U, Vp, 1, b.dST, Kp, b.dKend, Kp);
  // dg through the decays of the chunk's own pieces, into the difference array D (see below):
  // exp(gc_L) S0 depends on every g_u of the chunk; Kend_s on g_u for s < u; Qe_t and Ke_t on
  // g_u for u <= t.
  std::fill(b.D, b.D + (L + 1) * Kp, 0.0);
  const double* gl = b.gd + (L - 1) * Kp;
  for (int64_t c = 0; c < Kp; ++c) {
    const float e = expd(gl[c]);
    double acc = 0.0;
    for (int64_t j = 0; j < Vp; ++j) acc += double(b.S0[c * Vp + j]) * b.dS[c * Vp + j];
    b.D[c] += e * acc;
    for (int64_t j = 0; j < Vp; ++j) b.dS[c * Vp + j] *= e;
  }
  for (int64_t t = 0; t < L; ++t)
    for (int64_t c = 0; c < dk; ++c) {
      const int64_t i = t * Kp + c;
      const double x = double(b.QK[i]) * b.M[i] + double(b.QK[L * Kp + i]) * b.M[L * Kp + i];
      b.D[c] += x;
      b.D[(t + 1) * Kp + c] -= x;
      b.D[(t + 1) * Kp + c] += double(b.Kend[i]) * b.dKend[i];
    }
  gemm_acc(Kp, Vp, 2 * L, b.QK, 1, Kp, b.DOB, Vp, b.dS, Vp);

  // Through A and P: Qrow, Krow, Kcol.
  std::fill(b.Qrow, b.Qrow + L * Kp, 0.0f);
  std::fill(b.Krow, b.Krow + L * Kp, 0.0f);
  std::fill(b.Kcol, b.Kcol + L * Kp, 0.0f);
  for (int64_t r0 = 0; r0 < L; r0 += kSub) {
    const int64_t r1 = std::min(L, r0 + kSub), nr = r1 - r0;
    const double* gref = b.gd + r0 * Kp;
    if (r0 > 0) {
      for (int64_t t = r0; t < r1; ++t)
        for (int64_t c = 0; c < Kp; c += 8) {
          const v8 e = exp_diff8(b.gd + t * Kp + c, gref + c);
          st8(b.En + (t - r0) * Kp + c, e);
          st8(b.Qn + (t - r0) * Kp + c, ld8(b.Q + t * Kp + c) * e);
          st8(b.Kn + (t - r0) * Kp + c, ld8(b.K + t * Kp + c) * e);
        }
      for (int64_t s = 0; s < r0; ++s)
        for (int64_t c = 0; c < Kp; c += 8) {
          const v8 e = exp_diff8(gref + c, b.gd + s * Kp + c);
          st8(b.Er + s * Kp + c, e);
          st8(b.Kr + s * Kp + c, ld8(b.K + s * Kp + c) * e);
        }
      // Rows: Qrow_t += En_t (dP Kr)_t, Krow_t += En_t (dA Kr)_t.
      std::fill(b.tq, b.tq + nr * Kp, 0.0f);
      std::fill(b.tk, b.tk + nr * Kp, 0.0f);
      gemm_acc(nr, Kp, r0, dP + r0 * kC, kC, 1, b.Kr, Kp, b.tq, Kp);
      gemm_acc(nr, Kp, r0, dA + r0 * kC, kC, 1, b.Kr, Kp, b.tk, Kp);
      for (int64_t t = r0; t < r1; ++t)
        for (int64_t c = 0; c < Kp; c += 8) {
          const v8 e = ld8(b.En + (t - r0) * Kp + c);
          st8(b.Qrow + t * Kp + c, ld8(b.Qrow + t * Kp + c) + e * ld8(b.tq + (t - r0) * Kp + c));
          st8(b.Krow + t * Kp + c, ld8(b.Krow + t * Kp + c) + e * ld8(b.tk + (t - r0) * Kp + c));
        }
      // Columns: Kcol_s += Er_s (dP^T Qn + dA^T Kn)_s.
      std::fill(b.dKr, b.dKr + r0 * Kp, 0.0f);
      gemm_acc(r0, Kp, nr, dP + r0 * kC, 1, kC, b.Qn, Kp, b.dKr, Kp);
      gemm_acc(r0, Kp, nr, dA + r0 * kC, 1, kC, b.Kn, Kp, b.dKr, Kp);
      for (int64_t s = 0; s < r0; ++s)
        for (int64_t c = 0; c < Kp; c += 8)
          st8(b.Kcol + s * Kp + c,
              ld8(b.Kcol + s * Kp + c) + ld8(b.Er + s * Kp + c) * ld8(b.dKr + s * Kp + c));
      // dg of these pairs (t in the block, s < r0), from u = s + 1 to t: for u <= r0 it is
      // the columns' prefix sum_{s < u} C_s, for u > r0 the rows' suffix sum_{t >= u} R_t.
      std::fill(b.tot, b.tot + Kp, 0.0);
      for (int64_t s = 0; s < r0; ++s)
        for (int64_t c = 0; c < Kp; ++c) {
          const double x = double(b.Kr[s * Kp + c]) * b.dKr[s * Kp + c];
          b.D[(s + 1) * Kp + c] += x;
          b.tot[c] -= x;
        }
      for (int64_t t = r0 + 1; t < r1; ++t)
        for (int64_t c = 0; c < Kp; ++c) {
          const int64_t i = (t - r0) * Kp + c;
          const double x = double(b.Qn[i]) * b.tq[i] + double(b.Kn[i]) * b.tk[i];
          b.tot[c] += x;
          b.D[(t + 1) * Kp + c] -= x;
        }
      for (int64_t c = 0; c < Kp; ++c) b.D[(r0 + 1) * Kp + c] += b.tot[c];
    }
    // The diagonal block, element by element; a pair s < t adds its w_ts to dg_u for s < u <= t.
    for (int64_t t = r0; t < r1; ++t)
      for (int64_t s = r0; s <= t; ++s) {
        const v8 p = splat8(dP[t * kC + s]), a = splat8(dA[t * kC + s]);
        for (int64_t c = 0; c < Kp; c += 8) {
          const v8 e = ld8(b.Ed + pair_index(r0, t, s) * Kp + c);
          const v8 kse = ld8(b.K + s * Kp + c) * e;
          const v8 col = (p * ld8(b.Q + t * Kp + c) + a * ld8(b.K + t * Kp + c)) * e;
          st8(b.Qrow + t * Kp + c, ld8(b.Qrow + t * Kp + c) + p * kse);
          st8(b.Krow + t * Kp + c, ld8(b.Krow + t * Kp + c) + a * kse);
          st8(b.Kcol + s * Kp + c, ld8(b.Kcol + s * Kp + c) + col);
          if (s == t) continue;
          const v8 w = col * ld8(b.K + s * Kp + c);
          add8d(b.D + (s + 1) * Kp + c, w);
          add8d(b.D + (t + 1) * Kp + c, -w);
        }
      }
  }

  // Assemble dq and dk per token, then dg. Summing dgc_t over t >= u (dg_u) runs over every pair
  // (t, s) with both ends at or after u, whose +t and -s terms cancel: with each side rounded on
  // its own (Qrow_t against Kcol_s) that cost dg 40x the accuracy of the other gradients (4e-6
  // relative against central differences). So dg is assembled from each pair's term once, into a
  // difference array in f64 where its two ends cancel exactly: dg_u = sum_{j <= u} D_j.
  const float* dQe = b.M;
  const float* mKe = b.M + L * Kp;  // -dKe
  for (int64_t t = 0; t < L; ++t) {
    float* dqr = share.dq + (t0 + t) * share.stride;
    float* dkr = share.dk + (t0 + t) * share.stride;
    for (int64_t c = 0; c < Kp; c += 8) {
      const int64_t i = t * Kp + c;
      const v8 eg = exp8d(b.gd + i);
      const v8 eL = exp_diff8(gl + c, b.gd + i);
      const v8 qrow = ld8(b.Qrow + i), krow = ld8(b.Krow + i), kcol = ld8(b.Kcol + i);
      const v8 dqe = ld8(dQe + i), mke = ld8(mKe + i), dke = ld8(b.dKend + i);
      const v8 dQt = qrow + dqe * eg;
      const v8 dKt = krow + kcol - mke * eg + dke * eL;
      alignas(32) float out_q[8], out_k[8];
      st8(out_q, dQt * in.scale);
      st8(out_k, dKt);
      for (int64_t j = 0; j < 8 && c + j < dk; ++j) {
        dqr[c + j] = out_q[j];
        dkr[c + j] = out_k[j];
      }
    }
  }
  for (int64_t t = 1; t < L; ++t)
    for (int64_t c = 0; c < dk; ++c) b.D[t * Kp + c] += b.D[(t - 1) * Kp + c];
  for (int64_t t = 0; t < L; ++t) {
    float* dgr = dg_out + ((t0 + t) * d.Hv + h) * gw;
    const double* src = b.D + t * Kp;
    if (d.scalar_g) {
      double s = 0.0;
      for (int64_t c = 0; c < dk; ++c) s += src[c];
      dgr[0] = static_cast<float>(s);
    } else {
      for (int64_t c = 0; c < dk; ++c) dgr[c] = static_cast<float>(src[c]);
    }
  }
}

// Loads a [dk, dv] state into a zero-padded [Kp, Vp] buffer.
void load_padded(const Dims& d, const float* src, float* dst) {
  std::fill(dst, dst + d.Kp * d.Vp, 0.0f);
  if (src == nullptr) return;
  for (int64_t i = 0; i < d.dk; ++i)
    std::memcpy(dst + i * d.Vp, src + i * d.dv, d.dv * sizeof(float));
}

void store_unpadded(const Dims& d, const float* src, float* dst) {
  for (int64_t i = 0; i < d.dk; ++i)
    std::memcpy(dst + i * d.dv, src + i * d.Vp, d.dv * sizeof(float));
}

// Value head h: the boundary pass, then the chunks last first.
void backward_head(const Dims& d, const Inputs& in, int64_t h, const float* s0,
                   const float* d_final, float* ckpt, const Share& share, float* dv_out,
                   float* dg_out, float* dbeta_out, float* d_s0, const ChunkBuffers& b) {
  const int64_t area = d.dk * d.dv, n = d.chunks();
  load_padded(d, s0, b.S0);
  for (int64_t c = 0; c < n; ++c) {
    store_unpadded(d, b.S0, ckpt + c * area);
    if (c + 1 == n) break;
    const int64_t t0 = c * kC, L = std::min(kC, d.T - t0);
    recompute_chunk(d, in, h, t0, L, /*want_p=*/false, b);
    // S0 <- exp(gc_L) S0 + Kend^T U.
    const double* gl = b.gd + (L - 1) * d.Kp;
    for (int64_t i = 0; i < d.Kp; ++i) {
      const v8 e = splat8(expd(gl[i]));
      for (int64_t j = 0; j < d.Vp; j += 8) st8(b.S0 + i * d.Vp + j, ld8(b.S0 + i * d.Vp + j) * e);
    }
    gemm_acc(d.Kp, d.Vp, L, b.Kend, 1, d.Kp, b.U, d.Vp, b.S0, d.Vp);
  }
  load_padded(d, d_final, b.dS);
  for (int64_t c = n - 1; c >= 0; --c) {
    const int64_t t0 = c * kC, L = std::min(kC, d.T - t0);
    load_padded(d, ckpt + c * area, b.S0);
    recompute_chunk(d, in, h, t0, L, /*want_p=*/true, b);
    backward_chunk(d, in, h, t0, L, share, dv_out, dg_out, dbeta_out, b);
  }
  if (d_s0 != nullptr) store_unpadded(d, b.dS, d_s0);
}

Dims dims_of(int64_t T, int64_t Hk, int64_t Hv, int64_t dk, int64_t dv, bool scalar_g) {
  return Dims{T, Hk, Hv, dk, dv, round_up8(dk), round_up8(dv), scalar_g};
}

int64_t share_floats(const Dims& d) { return d.Hv == d.Hk ? 0 : 2 * d.Hv * d.T * d.dk; }

}  // namespace

int64_t kda_chunked_backward_scratch_floats(int64_t T, int64_t Hk, int64_t Hv, int64_t dk,
                                            int64_t dv) {
  const Dims d = dims_of(T, Hk, Hv, dk, dv, false);
  return pad16(d.Hv * d.chunks() * dk * dv) + pad16(share_floats(d)) +
         thread_count(Hv) * carve(d.Kp, d.Vp, nullptr, nullptr);
}

void kda_chunked_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                          const Tensor& beta, float scale, const Tensor& initial_state,
                          const Tensor& d_out, const Tensor& d_final_state, const Tensor& dq,
                          const Tensor& dk, const Tensor& dv, const Tensor& dg, const Tensor& dbeta,
                          const Tensor& d_initial_state, const Tensor& scratch) {
  const Dims d = dims_of(q.dim(0), q.dim(1), v.dim(1), q.dim(2), v.dim(2), g.dim(2) == 1);
  LOOM_CHECK(
      scratch.dtype() == DType::kF32 && scratch.is_contiguous() &&
          scratch.numel() >= kda_chunked_backward_scratch_floats(d.T, d.Hk, d.Hv, d.dk, d.dv),
      "kda_chunked_backward: scratch %s too small", scratch.describe().c_str());
  const int64_t area = d.dk * d.dv;
  const float* dfin = d_final_state.defined() ? d_final_state.data<float>() : nullptr;
  float* ds0 = d_initial_state.defined() ? d_initial_state.data<float>() : nullptr;
  if (d.T == 0) {
    if (ds0 != nullptr) {
      for (int64_t i = 0; i < d.Hv * area; ++i) ds0[i] = dfin ? dfin[i] : 0.0f;
    }
    return;
  }
  float* ckpt = scratch.data<float>();
  float* shares = ckpt + pad16(d.Hv * d.chunks() * area);
  float* work = shares + pad16(share_floats(d));
  const int64_t work_floats = carve(d.Kp, d.Vp, nullptr, nullptr);
  const Inputs in{q.data<float>(),
                  k.data<float>(),
                  v.data<float>(),
                  g.data<float>(),
                  beta.data<float>(),
                  d_out.data<float>(),
                  scale};
  const bool direct = d.Hv == d.Hk;  // each value head owns its key head's rows of dq and dk
  const int threads = thread_count(d.Hv);
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
#ifdef _OPENMP
    const int tid = omp_get_thread_num();
#else
    const int tid = 0;
#endif
    const FlushSubnormals ftz;
    ChunkBuffers b;
    carve(d.Kp, d.Vp, work + tid * work_floats, &b);
#pragma omp for schedule(dynamic, 1)
    for (int64_t h = 0; h < d.Hv; ++h) {
      const Share share =
          direct ? Share{dq.data<float>() + h * d.dk, dk.data<float>() + h * d.dk, d.Hk * d.dk}
                 : Share{shares + h * d.T * d.dk, shares + (d.Hv + h) * d.T * d.dk, d.dk};
      backward_head(d, in, h, initial_state.data<float>() + h * area,
                    dfin ? dfin + h * area : nullptr, ckpt + h * d.chunks() * area, share,
                    dv.data<float>(), dg.data<float>(), dbeta.data<float>(),
                    ds0 ? ds0 + h * area : nullptr, b);
    }
  }
  if (direct) return;
  // Value heads sharing a key head: their shares summed in head order (thread-count invariant).
  sum_key_head_shares(shares, shares + d.Hv * d.T * d.dk, d.T, d.Hk, d.Hv, d.dk, dq.data<float>(),
                      dk.data<float>());
}

}  // namespace loom::cpu
