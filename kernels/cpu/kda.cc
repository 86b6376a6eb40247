// KDA / Gated DeltaNet on the CPU: the token recurrence (reference and decode path), the chunked
// WY/UT form (prefill path), and the decay gates.
//
// Chunked form, per value head and chunk of L <= 64 tokens with incoming state S0 [dk, dv].
// Let gc_t = sum_{u <= t} g_u (per channel, inside the chunk) and G_{ts} = exp(gc_t - gc_s),
// which is <= 1 for s <= t. Writing the state after token t as
//   S_t = exp(gc_t) S0 + sum_{s <= t} (G_{ts} k_s) u_s^T
// the recurrence gives the pseudo-values u through a unit lower-triangular system
//   u_t + sum_{s < t} A_{ts} u_s = beta_t (v_t - S0^T (exp(gc_t) k_t)),
//   A_{ts} = beta_t sum_c k_tc k_sc G_{ts,c},
// and then
//   o_t     = S0^T (exp(gc_t) q_t) + sum_{s <= t} P_{ts} u_s,   P_{ts} = sum_c q_tc k_sc G_{ts,c}
//   S_L     = exp(gc_L) S0 + sum_s (G_{Ls} k_s) u_s^T.
// Nothing of the form exp(-gc) over a whole chunk is ever formed. A and P are built in 16-token
// sub-chunks: for sub-chunk i starting at r0, the block against earlier tokens s < r0 factorises
// through the reference point gc_{r0}: G_{ts} = exp(gc_t - gc_{r0}) * exp(gc_{r0} - gc_s), both
// factors <= 1, which turns it into a small GEMM. The 16x16 diagonal block uses the same
// factorisation (there exp(gc_{r0} - gc_s) >= 1) only when the decay across the sub-chunk is at
// most kMaxFactorSpan = 80 nats in every channel, which bounds every factor by e^80 (always true
// for bounded gates, g >= -5); otherwise it forms exp(gc_t - gc_s) <= 1 element by element. The
// remaining exponents are gc_t, gc_L - gc_s and gc_t - gc_{r0}, all <= 0.
// Cumulative decays are summed in double and every exponent is rounded to f32 only after the
// subtraction, so no cancellation error creeps in when gc has grown large within a chunk; the
// remainder of that rounding is carried into the exponential (exp8_split), without which a
// factorised diagonal block loses |exponent| * 2^-24 of relative accuracy (see there).
// The GEMMs are a small register-blocked kernel on GCC/Clang vector types (AVX2 here;
// kernels/cpu/kda_simd.h, shared with the chunked backward): per chunk
// [Qe; -Ke] S0, the sub-chunk blocks of A and P, the blocked forward substitution, P U and the
// state update (K exp(gc_L - gc))^T U.
#include "kernels/cpu/kda.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/activation.h"
#include "kernels/cpu/kda_simd.h"
#include "kernels/cpu/varlen.h"
#include "kernels/kda.h"

namespace loom::cpu {
namespace {

struct KdaDims {
  int64_t T, Hk, Hv, dk, dv;
  bool scalar_g;
};

KdaDims check_kda_args(const char* name, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& g, const Tensor& beta, const Tensor& state,
                       const Tensor& out) {
  LOOM_CHECK_F32(q);
  LOOM_CHECK_F32(k);
  LOOM_CHECK_F32(v);
  LOOM_CHECK_F32(g);
  LOOM_CHECK_F32(beta);
  LOOM_CHECK_F32(state);
  LOOM_CHECK_F32(out);
  LOOM_CHECK(q.ndim() == 3 && v.ndim() == 3, "%s: q %s v %s", name, q.describe().c_str(),
             v.describe().c_str());
  KdaDims d{};
  d.T = q.dim(0);
  d.Hk = q.dim(1);
  d.dk = q.dim(2);
  d.Hv = v.dim(1);
  d.dv = v.dim(2);
  LOOM_CHECK(d.Hk > 0 && d.Hv % d.Hk == 0, "%s: Hv %lld is not a multiple of Hk %lld", name,
             static_cast<long long>(d.Hv), static_cast<long long>(d.Hk));
  LOOM_CHECK_SHAPE(k, d.T, d.Hk, d.dk);
  LOOM_CHECK_SHAPE(v, d.T, d.Hv, d.dv);
  LOOM_CHECK(
      g.ndim() == 3 && g.dim(0) == d.T && g.dim(1) == d.Hv && (g.dim(2) == d.dk || g.dim(2) == 1),
      "%s: g %s, expected [%lld, %lld, %lld or 1]", name, g.describe().c_str(),
      static_cast<long long>(d.T), static_cast<long long>(d.Hv), static_cast<long long>(d.dk));
  d.scalar_g = g.dim(2) == 1 && d.dk != 1;
  LOOM_CHECK_SHAPE(beta, d.T, d.Hv);
  LOOM_CHECK_SHAPE(state, d.Hv, d.dk, d.dv);
  LOOM_CHECK_SHAPE(out, d.T, d.Hv, d.dv);
  return d;
}

using namespace kda_simd;  // NOLINT(google-build-using-namespace): this family's own helpers

// Per-thread buffers of the chunked form. Rows are padded to multiples of 8 with zeros, so every
// GEMM sees n % 8 == 0 and padded channels contribute nothing.
struct ChunkWork {
  static constexpr int64_t C = kKdaChunk;
  int64_t Kp, Vp;
  std::vector<float> S;     // [Kp, Vp] the state
  std::vector<float> Q, K;  // [C, Kp] scaled q, k
  std::vector<float> KT;    // [Kp, C] k transposed
  std::vector<float> QK;    // [2C, Kp] rows [0, L): q exp(gc); rows [L, 2L): -k exp(gc)
  std::vector<float> OU;    // [2C, Vp] rows [0, L): outputs; rows [L, 2L): pseudo-values U
  std::vector<float> A, P;  // [C, C]
  std::vector<float> Qn, Kn, KrT, KendT;
  std::vector<double> gd, gdT;  // cumulative decay [C, Kp] and transposed [Kp, C]
  ChunkWork(int64_t dk, int64_t dv) : Kp(round_up8(dk)), Vp(round_up8(dv)) {
    S.assign(Kp * Vp, 0.0f);
    Q.assign(C * Kp, 0.0f);
    K.assign(C * Kp, 0.0f);
    KT.assign(Kp * C, 0.0f);
    QK.assign(2 * C * Kp, 0.0f);
    OU.assign(2 * C * Vp, 0.0f);
    A.assign(C * C, 0.0f);
    P.assign(C * C, 0.0f);
    Qn.assign(16 * Kp, 0.0f);
    Kn.assign(16 * Kp, 0.0f);
    KrT.assign(Kp * C, 0.0f);
    KendT.assign(Kp * C, 0.0f);
    gd.assign(C * Kp, 0.0);
    gdT.assign(Kp * C, 0.0);
  }
};

// Largest decay span (in nats) across one 16-token sub-chunk for which the diagonal block may
// also be factorised through the sub-chunk's reference point: the growing factor
// exp(gc_{r0} - gc_s) then stays below e^80 ~ 5.5e34, far from f32 overflow (3.4e38), and the
// shrinking one above e^-80, far from the f32 normal range's end (1.2e-38). Bounded gates
// (g >= -5, 15 steps) always qualify; otherwise the block falls back to exponentials per element.
constexpr double kMaxFactorSpan = 80.0;

// One head of the chunked form over all T tokens; S0 is in w.S (padded) and is updated there.
void kda_chunked_head(const KdaDims& d, int64_t h, const float* qp, const float* kp,
                      const float* vp, const float* gp, const float* bp, float scale, float* op,
                      ChunkWork& w) {
  constexpr int64_t C = ChunkWork::C;
  constexpr int64_t kSub = 16;
  const int64_t Kp = w.Kp, Vp = w.Vp, dk = d.dk, dv = d.dv;
  const int64_t hk = h / (d.Hv / d.Hk);
  const int64_t gw = d.scalar_g ? 1 : dk;
  float* S = w.S.data();
  float* Q = w.Q.data();
  float* K = w.K.data();
  float* KT = w.KT.data();
  float* QK = w.QK.data();
  float* A = w.A.data();
  float* P = w.P.data();
  float* Qn = w.Qn.data();
  float* Kn = w.Kn.data();
  float* KrT = w.KrT.data();
  float* KendT = w.KendT.data();
  double* gd = w.gd.data();
  double* gdT = w.gdT.data();

  for (int64_t t0 = 0; t0 < d.T; t0 += C) {
    const int64_t L = std::min(C, d.T - t0);
    const int64_t Lp = round_up8(L);
    float* O = w.OU.data();
    float* U = O + L * Vp;
    float* Qe = QK;
    float* Ken = QK + L * Kp;
    // Load the chunk: q (scaled), k, v into padded rows; gc = cumsum(g) in double.
    for (int64_t t = 0; t < L; ++t) {
      const int64_t tt = t0 + t;
      const float* qs = qp + (tt * d.Hk + hk) * dk;
      const float* ks = kp + (tt * d.Hk + hk) * dk;
      const float* vs = vp + (tt * d.Hv + h) * dv;
      const float* gs = gp + (tt * d.Hv + h) * gw;
      float* qr = Q + t * Kp;
      float* kr = K + t * Kp;
      double* gr = gd + t * Kp;
      for (int64_t c = 0; c < dk; ++c) {
        qr[c] = qs[c] * scale;
        kr[c] = ks[c];
      }
      if (d.scalar_g) {
        const double gv = gs[0];
        for (int64_t c = 0; c < dk; ++c) gr[c] = gv;
      } else {
        for (int64_t c = 0; c < dk; ++c) gr[c] = gs[c];
      }
      if (t > 0) {
        const double* gprev = gr - Kp;
        for (int64_t c = 0; c < dk; ++c) gr[c] += gprev[c];
      }
      std::memcpy(U + t * Vp, vs, dv * sizeof(float));
      if (dv < Vp) std::fill(U + t * Vp + dv, U + (t + 1) * Vp, 0.0f);
    }
    std::fill(O, O + L * Vp, 0.0f);
    // Transposed copies of k and gc (columns L .. Lp of KT stay zero, those of gdT finite).
    for (int64_t c = 0; c < dk; ++c)
      for (int64_t t = 0; t < Lp; ++t) {
        KT[c * C + t] = t < L ? K[t * Kp + c] : 0.0f;
        gdT[c * C + t] = t < L ? gd[t * Kp + c] : 0.0;
      }
    // Decay from the chunk start: Qe = q exp(gc), Ken = -k exp(gc).
    for (int64_t t = 0; t < L; ++t) {
      const double* gr = gd + t * Kp;
      for (int64_t c = 0; c < Kp; c += 8) {
        const v8 e = exp8d(gr + c);
        st8(Qe + t * Kp + c, ld8(Q + t * Kp + c) * e);
        st8(Ken + t * Kp + c, -ld8(K + t * Kp + c) * e);
      }
    }
    // A (strictly lower, before beta and sign) and P (lower with diagonal), by 16-token blocks.
    std::fill(A, A + C * C, 0.0f);
    std::fill(P, P + C * C, 0.0f);
    for (int64_t r0 = 0; r0 < L; r0 += kSub) {
      const int64_t r1 = std::min(L, r0 + kSub);
      const int64_t nr = r1 - r0;
      const double* gref = gd + r0 * Kp;
      const double* glast = gd + (r1 - 1) * Kp;
      bool factor_diag = true;
      for (int64_t c = 0; c < dk; ++c) factor_diag &= gref[c] - glast[c] <= kMaxFactorSpan;
      // Rows of this block decayed to the reference point gc_{r0} (factors <= 1).
      for (int64_t t = r0; t < r1; ++t) {
        const double* gr = gd + t * Kp;
        for (int64_t c = 0; c < Kp; c += 8) {
          const v8 e = exp_diff8(gr + c, gref + c);
          st8(Qn + (t - r0) * Kp + c, ld8(Q + t * Kp + c) * e);
          st8(Kn + (t - r0) * Kp + c, ld8(K + t * Kp + c) * e);
        }
      }
      // Keys from the reference point back to token s: exp(gc_{r0} - gc_s), <= 1 for s <= r0,
      // and for r0 < s < r1 (diagonal block, only when factor_diag) at most e^kMaxFactorSpan.
      const int64_t ns = factor_diag ? round_up8(r1) : r0;
      for (int64_t c = 0; c < dk; ++c) {
        const double gc = gref[c];
        for (int64_t s = 0; s < ns; s += 8)
          st8(KrT + c * C + s, ld8(KT + c * C + s) * exp_diff8s(gc, gdT + c * C + s));
      }
      gemm_acc(nr, ns, Kp, Kn, Kp, 1, KrT, C, A + r0 * C, C);
      gemm_acc(nr, ns, Kp, Qn, Kp, 1, KrT, C, P + r0 * C, C);
      if (factor_diag) {
        // Drop what the block product put on or above the diagonal (A) / above it (P).
        for (int64_t t = r0; t < r1; ++t) {
          std::fill(A + t * C + t, A + t * C + ns, 0.0f);
          std::fill(P + t * C + t + 1, P + t * C + ns, 0.0f);
        }
      } else {
        // Diagonal block with exponentials element by element.
        for (int64_t t = r0; t < r1; ++t) {
          const double* gt = gd + t * Kp;
          const float* qt = Q + t * Kp;
          const float* kt = K + t * Kp;
          for (int64_t s = r0; s <= t; ++s) {
            const double* gs = gd + s * Kp;
            const float* ks = K + s * Kp;
            v8 sa = v8{}, sp = v8{};
            for (int64_t c = 0; c < Kp; c += 8) {
              const v8 kse = ld8(ks + c) * exp_diff8(gt + c, gs + c);
              sa += ld8(kt + c) * kse;
              sp += ld8(qt + c) * kse;
            }
            if (s < t) A[t * C + s] = hsum8(sa);
            P[t * C + s] = hsum8(sp);
          }
        }
      }
    }
    // [O; U] = [Qe; Ken] S0 + [0; V]: outputs' state term and U = v - S0^T exp(gc) k, together.
    gemm_acc(2 * L, Vp, Kp, QK, Kp, 1, S, Vp, O, Vp);
    // A <- -beta_t A; U <- beta_t U.
    for (int64_t t = 0; t < L; ++t) {
      const float b = bp[(t0 + t) * d.Hv + h];
      for (int64_t s = 0; s < t; ++s) A[t * C + s] *= -b;
      for (int64_t c = 0; c < Vp; c += 8) st8(U + t * Vp + c, ld8(U + t * Vp + c) * b);
    }
    // Forward substitution, blocked by sub-chunk: U_t += sum_{s<t} A_ts U_s.
    for (int64_t r0 = 0; r0 < L; r0 += kSub) {
      const int64_t r1 = std::min(L, r0 + kSub);
      gemm_acc(r1 - r0, Vp, r0, A + r0 * C, C, 1, U, Vp, U + r0 * Vp, Vp);
      for (int64_t t = r0 + 1; t < r1; ++t) {
        float* ut = U + t * Vp;
        for (int64_t s = r0; s < t; ++s) {
          const v8 a = splat8(A[t * C + s]);
          const float* us = U + s * Vp;
          for (int64_t c = 0; c < Vp; c += 8) st8(ut + c, ld8(ut + c) + a * ld8(us + c));
        }
      }
    }
    // O += P U (P lower triangular: rows of block [r0, r1) need columns < r1).
    for (int64_t r0 = 0; r0 < L; r0 += kSub) {
      const int64_t r1 = std::min(L, r0 + kSub);
      gemm_acc(r1 - r0, Vp, r1, P + r0 * C, C, 1, U, Vp, O + r0 * Vp, Vp);
    }
    for (int64_t t = 0; t < L; ++t)
      std::memcpy(op + ((t0 + t) * d.Hv + h) * dv, O + t * Vp, dv * sizeof(float));
    // S <- exp(gc_L) S0 + (exp(gc_L - gc_s) k_s)^T U.
    const double* gl = gd + (L - 1) * Kp;
    for (int64_t c = 0; c < dk; ++c) {
      const double gc = gl[c];
      for (int64_t s = 0; s < Lp; s += 8)
        st8(KendT + c * C + s, ld8(KT + c * C + s) * exp_diff8s(gc, gdT + c * C + s));
      const v8 e = splat8(expd(gc));
      float* sr = S + c * Vp;
      for (int64_t j = 0; j < Vp; j += 8) st8(sr + j, ld8(sr + j) * e);
    }
    gemm_acc(dk, Vp, L, KendT, C, 1, U, Vp, S, Vp);
  }
}

// Scratch of one thread of the recurrence.
struct RecurrentWork {
  std::vector<float> kv, u, decay;
  explicit RecurrentWork(const KdaDims& d)
      : kv(static_cast<size_t>(d.dv)),
        u(static_cast<size_t>(d.dv)),
        decay(static_cast<size_t>(d.dk)) {}
};

// Value head h of the recurrence over one sequence's d.T tokens (q, k, v, g, beta and out point at
// the sequence's first row); S: the head's state [dk, dv], updated in place.
void kda_recurrent_head(const KdaDims& d, int64_t h, const float* qp, const float* kp,
                        const float* vp, const float* gp, const float* bp, float scale, float* S,
                        float* op, RecurrentWork& w) {
  const int64_t dk = d.dk, dv = d.dv, gw = d.scalar_g ? 1 : dk;
  const int64_t hk = h / (d.Hv / d.Hk);
  float* kv = w.kv.data();
  float* u = w.u.data();
  float* decay = w.decay.data();
  for (int64_t t = 0; t < d.T; ++t) {
    const float* qt = qp + (t * d.Hk + hk) * dk;
    const float* kt = kp + (t * d.Hk + hk) * dk;
    const float* vt = vp + (t * d.Hv + h) * dv;
    const float* gt = gp + (t * d.Hv + h) * gw;
    const float bt = bp[t * d.Hv + h];
    float* ot = op + (t * d.Hv + h) * dv;
    // Pass 1: decay the state and form S^T k.
    std::fill(kv, kv + dv, 0.0f);
    if (d.scalar_g) {
      std::fill(decay, decay + dk, fexp(gt[0]));
    } else {
      int64_t i = 0;
      for (; i + 8 <= dk; i += 8) st8(decay + i, fexp8(ld8(gt + i)));
      for (; i < dk; ++i) decay[i] = fexp(gt[i]);
    }
    for (int64_t i = 0; i < dk; ++i) {
      const float e = decay[i];
      const float ki = kt[i];
      float* Si = S + i * dv;
#pragma omp simd
      for (int64_t j = 0; j < dv; ++j) {
        const float s = Si[j] * e;
        Si[j] = s;
        kv[j] += ki * s;
      }
    }
#pragma omp simd
    for (int64_t j = 0; j < dv; ++j) {
      u[j] = bt * (vt[j] - kv[j]);
      ot[j] = 0.0f;
    }
    // Pass 2: rank-1 update and the output o = S^T (scale q).
    for (int64_t i = 0; i < dk; ++i) {
      const float ki = kt[i], qi = qt[i] * scale;
      float* Si = S + i * dv;
#pragma omp simd
      for (int64_t j = 0; j < dv; ++j) {
        const float s = Si[j] + ki * u[j];
        Si[j] = s;
        ot[j] += qi * s;
      }
    }
  }
}

// The chunked form over one sequence (tensors as kda_chunked_forward's), all heads.
void kda_chunked_sequence(const KdaDims& d, const float* qp, const float* kp, const float* vp,
                          const float* gp, const float* bp, float scale, float* sp, float* op) {
  if (d.T == 0) return;
#pragma omp parallel if (d.Hv > 1 && d.T * d.dk * d.dv > 32768)
  {
    ChunkWork w(d.dk, d.dv);
#pragma omp for schedule(dynamic, 1)
    for (int64_t h = 0; h < d.Hv; ++h) {
      float* Sh = sp + h * d.dk * d.dv;
      std::fill(w.S.begin(), w.S.end(), 0.0f);
      for (int64_t i = 0; i < d.dk; ++i)
        std::memcpy(w.S.data() + i * w.Vp, Sh + i * d.dv, d.dv * sizeof(float));
      kda_chunked_head(d, h, qp, kp, vp, gp, bp, scale, op, w);
      for (int64_t i = 0; i < d.dk; ++i)
        std::memcpy(Sh + i * d.dv, w.S.data() + i * w.Vp, d.dv * sizeof(float));
    }
  }
}

}  // namespace

void kda_recurrent_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                           const Tensor& beta, float scale, const Tensor& state,
                           const Tensor& out) {
  const KdaDims d = check_kda_args("kda_recurrent_forward", q, k, v, g, beta, state, out);
  const float* qp = q.data<float>();
  const float* kp = k.data<float>();
  const float* vp = v.data<float>();
  const float* gp = g.data<float>();
  const float* bp = beta.data<float>();
  float* sp = state.data<float>();
  float* op = out.data<float>();
#pragma omp parallel if (d.Hv > 1 && d.Hv * d.T * d.dk * d.dv > 65536)
  {
    RecurrentWork w(d);
#pragma omp for schedule(static)
    for (int64_t h = 0; h < d.Hv; ++h)
      kda_recurrent_head(d, h, qp, kp, vp, gp, bp, scale, sp + h * d.dk * d.dv, op, w);
  }
}

void kda_chunked_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                         const Tensor& beta, float scale, const Tensor& state, const Tensor& out) {
  const KdaDims d = check_kda_args("kda_chunked_forward", q, k, v, g, beta, state, out);
  kda_chunked_sequence(d, q.data<float>(), k.data<float>(), v.data<float>(), g.data<float>(),
                       beta.data<float>(), scale, state.data<float>(), out.data<float>());
}

void kda_varlen_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                        const Tensor& beta, float scale, const Tensor& states,
                        const Tensor& state_slots, const Tensor& cu_seqlens, bool batch_invariant,
                        const Tensor& out) {
  LOOM_CHECK_F32(states);
  LOOM_CHECK(states.ndim() == 4 && states.dim(0) > 0, "kda_varlen_forward: states %s",
             states.describe().c_str());
  // The whole batch as one sequence checks every shape but the row count of the slot's state.
  const KdaDims all = check_kda_args("kda_varlen_forward", q, k, v, g, beta, states.select(0), out);
  const int64_t B = check_cu_seqlens("kda_varlen_forward", cu_seqlens, all.T);
  check_state_slots("kda_varlen_forward", state_slots, B, states.dim(0));
  const int64_t* cu = cu_seqlens.data<int64_t>();
  const int32_t* slots = state_slots.data<int32_t>();
  const int64_t gw = all.scalar_g ? 1 : all.dk;
  const int64_t state_elems = all.Hv * all.dk * all.dv;
  auto sequence = [&](int64_t b) {
    KdaDims d = all;
    d.T = cu[b + 1] - cu[b];
    return d;
  };
  auto recurrent = [&](int64_t b) {
    return kda_varlen_takes_recurrence(cu[b + 1] - cu[b], batch_invariant);
  };
  const float* qp = q.data<float>();
  const float* kp = k.data<float>();
  const float* vp = v.data<float>();
  const float* gp = g.data<float>();
  const float* bp = beta.data<float>();
  float* sp = states.data<float>();
  float* op = out.data<float>();
  // Every (sequence, head) pair of the recurrent sequences in one parallel loop: a decode batch
  // spreads over the threads even with few heads.
  int64_t recurrent_work = 0;
  for (int64_t b = 0; b < B; ++b)
    if (recurrent(b)) recurrent_work += (cu[b + 1] - cu[b]) * state_elems;
#pragma omp parallel if (B * all.Hv > 1 && recurrent_work > 65536)
  {
    RecurrentWork w(all);
#pragma omp for schedule(static)
    for (int64_t item = 0; item < B * all.Hv; ++item) {
      const int64_t b = item / all.Hv, h = item % all.Hv;
      if (!recurrent(b)) continue;
      const int64_t r = cu[b];
      kda_recurrent_head(sequence(b), h, qp + r * all.Hk * all.dk, kp + r * all.Hk * all.dk,
                         vp + r * all.Hv * all.dv, gp + r * all.Hv * gw, bp + r * all.Hv, scale,
                         sp + slots[b] * state_elems + h * all.dk * all.dv,
                         op + r * all.Hv * all.dv, w);
    }
  }
  for (int64_t b = 0; b < B; ++b) {
    if (recurrent(b)) continue;
    const int64_t r = cu[b];
    kda_chunked_sequence(sequence(b), qp + r * all.Hk * all.dk, kp + r * all.Hk * all.dk,
                         vp + r * all.Hv * all.dv, gp + r * all.Hv * gw, bp + r * all.Hv, scale,
                         sp + slots[b] * state_elems, op + r * all.Hv * all.dv);
  }
}

void kda_gate_forward(const Tensor& f, const Tensor& A_log, const Tensor& dt_bias,
                      float lower_bound, const Tensor& g) {
  LOOM_CHECK_F32(f);
  LOOM_CHECK_F32(A_log);
  LOOM_CHECK_F32(g);
  LOOM_CHECK(f.ndim() == 2, "kda_gate_forward: f %s, expected [T, H * dk] or [T, H]",
             f.describe().c_str());
  LOOM_CHECK(g.shape() == f.shape(), "kda_gate_forward: f %s g %s", f.describe().c_str(),
             g.describe().c_str());
  LOOM_CHECK(lower_bound <= 0.0f, "kda_gate_forward: lower_bound %g > 0", lower_bound);
  const int64_t T = f.dim(0), width = f.dim(1), H = A_log.numel();
  LOOM_CHECK(H > 0 && width % H == 0, "kda_gate_forward: f %s with A_log %s", f.describe().c_str(),
             A_log.describe().c_str());
  const float* bias = nullptr;
  if (dt_bias.defined()) {
    LOOM_CHECK_F32(dt_bias);
    LOOM_CHECK(dt_bias.numel() == width, "kda_gate_forward: dt_bias %s, f %s",
               dt_bias.describe().c_str(), f.describe().c_str());
    bias = dt_bias.data<float>();
  }
  const int64_t per_head = width / H;
  std::vector<float> a(static_cast<size_t>(H));
  for (int64_t h = 0; h < H; ++h) a[h] = std::exp(A_log.data<float>()[h]);
  const float* fp = f.data<float>();
  float* gp = g.data<float>();
#pragma omp parallel for schedule(static) if (T * width > 65536)
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < width; ++c) {
      const float x = fp[t * width + c] + (bias ? bias[c] : 0.0f);
      const float ah = a[c / per_head];
      gp[t * width + c] = lower_bound == 0.0f ? -ah * softplusf(x) : lower_bound * sigmoidf(ah * x);
    }
  }
}

}  // namespace loom::cpu
