#include "kernels/cpu/kda_backward.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/kda_backward.h"

namespace loom::cpu {
namespace {

struct Dims {
  int64_t T, Hk, Hv, dk, dv;
  bool scalar_g;
};

// One token of the forward recurrence on state S (kda.h): S = diag(e) S; S += k u^T.
void forward_token(const Dims& d, const float* kt, const float* vt, const float* gt, float bt,
                   float* S, float* kv) {
  std::fill(kv, kv + d.dv, 0.0f);
  for (int64_t i = 0; i < d.dk; ++i) {
    const float e = std::exp(gt[d.scalar_g ? 0 : i]);
    float* Si = S + i * d.dv;
    for (int64_t j = 0; j < d.dv; ++j) {
      Si[j] *= e;
      kv[j] += kt[i] * Si[j];
    }
  }
  for (int64_t i = 0; i < d.dk; ++i) {
    float* Si = S + i * d.dv;
    for (int64_t j = 0; j < d.dv; ++j) Si[j] += kt[i] * bt * (vt[j] - kv[j]);
  }
}

// The reverse recurrence of value head h. dq_h, dk_h: [T, dk] this head's share of dq and dk.
void backward_head(const Dims& d, int64_t h, const float* q, const float* k, const float* v,
                   const float* g, const float* beta, float scale, const float* s0,
                   const float* d_out, const float* d_final, float* dq_h, float* dk_h, float* dv,
                   float* dg, float* dbeta, float* d_s0) {
  const int64_t dk = d.dk, dvv = d.dv, area = dk * dvv, gw = d.scalar_g ? 1 : dk;
  const int64_t hk = h / (d.Hv / d.Hk), seg = kKdaBackwardSegment;
  const int64_t segments = std::max<int64_t>(1, (d.T + seg - 1) / seg);
  std::vector<float> ckpt(segments * area), pre(seg * area), dS(area), Sp(area);
  std::vector<float> kv(dvv), u(dvv), du(dvv), dkv(dvv), e(dk);
  auto qt = [&](int64_t t) { return q + (t * d.Hk + hk) * dk; };
  auto kt = [&](int64_t t) { return k + (t * d.Hk + hk) * dk; };
  auto vt = [&](int64_t t) { return v + (t * d.Hv + h) * dvv; };
  auto gt = [&](int64_t t) { return g + (t * d.Hv + h) * gw; };
  auto bt = [&](int64_t t) { return beta[t * d.Hv + h]; };

  // Checkpoints: the state before tokens 0, seg, 2 seg, ...
  std::vector<float> S(s0, s0 + area);
  for (int64_t t = 0; t < d.T; ++t) {
    if (t % seg == 0) std::copy(S.begin(), S.end(), ckpt.begin() + (t / seg) * area);
    forward_token(d, kt(t), vt(t), gt(t), bt(t), S.data(), kv.data());
  }
  if (d_final != nullptr) {
    std::copy(d_final, d_final + area, dS.begin());
  } else {
    std::fill(dS.begin(), dS.end(), 0.0f);
  }
  for (int64_t c = segments - 1; c >= 0; --c) {
    const int64_t t0 = c * seg, t1 = std::min(d.T, t0 + seg);
    // Replay the segment, keeping the state before each token.
    std::copy(ckpt.begin() + c * area, ckpt.begin() + (c + 1) * area, S.begin());
    for (int64_t t = t0; t < t1; ++t) {
      std::copy(S.begin(), S.end(), pre.begin() + (t - t0) * area);
      forward_token(d, kt(t), vt(t), gt(t), bt(t), S.data(), kv.data());
    }
    for (int64_t t = t1 - 1; t >= t0; --t) {
      const float* P = pre.data() + (t - t0) * area;
      const float* qv = qt(t);
      const float* kvec = kt(t);
      const float* vv = vt(t);
      const float* gv = gt(t);
      const float b = bt(t);
      const float* dO = d_out + (t * d.Hv + h) * dvv;
      // Recompute S' = diag(e) P, kv = S'^T k, u = b (v - kv); S_t = S' + k u^T.
      std::fill(kv.begin(), kv.end(), 0.0f);
      for (int64_t i = 0; i < dk; ++i) {
        e[i] = std::exp(gv[d.scalar_g ? 0 : i]);
        for (int64_t j = 0; j < dvv; ++j) {
          Sp[i * dvv + j] = e[i] * P[i * dvv + j];
          kv[j] += kvec[i] * Sp[i * dvv + j];
        }
      }
      for (int64_t j = 0; j < dvv; ++j) u[j] = b * (vv[j] - kv[j]);
      // o = S_t^T (scale q): dq and the output's share of dS.
      float* dqt = dq_h + t * dk;
      for (int64_t i = 0; i < dk; ++i) {
        float acc = 0.0f;
        const float qi = scale * qv[i];
        for (int64_t j = 0; j < dvv; ++j) {
          acc += (Sp[i * dvv + j] + kvec[i] * u[j]) * dO[j];
          dS[i * dvv + j] += qi * dO[j];
        }
        dqt[i] = scale * acc;
      }
      // S_t = S' + k u^T.
      std::fill(du.begin(), du.end(), 0.0f);
      float* dkt = dk_h + t * dk;
      for (int64_t i = 0; i < dk; ++i) {
        float acc = 0.0f;
        for (int64_t j = 0; j < dvv; ++j) {
          acc += dS[i * dvv + j] * u[j];
          du[j] += kvec[i] * dS[i * dvv + j];
        }
        dkt[i] = acc;
      }
      // u = b (v - kv).
      float db = 0.0f;
      float* dvt = dv + (t * d.Hv + h) * dvv;
      for (int64_t j = 0; j < dvv; ++j) {
        db += du[j] * (vv[j] - kv[j]);
        dvt[j] = b * du[j];
        dkv[j] = -b * du[j];
      }
      dbeta[t * d.Hv + h] = db;
      // kv = S'^T k, then S' = diag(e) P.
      float* dgt = dg + (t * d.Hv + h) * gw;
      if (d.scalar_g) dgt[0] = 0.0f;
      for (int64_t i = 0; i < dk; ++i) {
        float acc_k = 0.0f, acc_g = 0.0f;
        for (int64_t j = 0; j < dvv; ++j) {
          const float s = Sp[i * dvv + j];
          acc_k += s * dkv[j];
          const float dsp = dS[i * dvv + j] + kvec[i] * dkv[j];
          acc_g += s * dsp;
          dS[i * dvv + j] = e[i] * dsp;
        }
        dkt[i] += acc_k;
        if (d.scalar_g) {
          dgt[0] += acc_g;
        } else {
          dgt[i] = acc_g;
        }
      }
    }
  }
  if (d_s0 != nullptr) std::copy(dS.begin(), dS.end(), d_s0);
}

}  // namespace

void kda_recurrent_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                            const Tensor& beta, float scale, const Tensor& initial_state,
                            const Tensor& d_out, const Tensor& d_final_state, const Tensor& dq,
                            const Tensor& dk, const Tensor& dv, const Tensor& dg,
                            const Tensor& dbeta, const Tensor& d_initial_state) {
  const Dims d{q.dim(0), q.dim(1), v.dim(1), q.dim(2), v.dim(2), g.dim(2) == 1};
  const int64_t area = d.dk * d.dv;
  // Each value head writes its own share of dq and dk; the shares are summed per key head
  // afterwards in head order, so the result is the same whatever the threads do.
  std::vector<float> dq_heads(d.Hv * d.T * d.dk), dk_heads(d.Hv * d.T * d.dk);
  const float* dfin = d_final_state.defined() ? d_final_state.data<float>() : nullptr;
  float* ds0 = d_initial_state.defined() ? d_initial_state.data<float>() : nullptr;
#pragma omp parallel for schedule(dynamic, 1) if (d.Hv > 1 && d.T * area > 4096)
  for (int64_t h = 0; h < d.Hv; ++h) {
    backward_head(d, h, q.data<float>(), k.data<float>(), v.data<float>(), g.data<float>(),
                  beta.data<float>(), scale, initial_state.data<float>() + h * area,
                  d_out.data<float>(), dfin ? dfin + h * area : nullptr,
                  dq_heads.data() + h * d.T * d.dk, dk_heads.data() + h * d.T * d.dk,
                  dv.data<float>(), dg.data<float>(), dbeta.data<float>(),
                  ds0 ? ds0 + h * area : nullptr);
  }
  sum_key_head_shares(dq_heads.data(), dk_heads.data(), d.T, d.Hk, d.Hv, d.dk, dq.data<float>(),
                      dk.data<float>());
}

void sum_key_head_shares(const float* dq_shares, const float* dk_shares, int64_t T, int64_t Hk,
                         int64_t Hv, int64_t dk, float* dq, float* d_k) {
  const int64_t group = Hv / Hk;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t hk = 0; hk < Hk; ++hk) {
      float* dqr = dq + (t * Hk + hk) * dk;
      float* dkr = d_k + (t * Hk + hk) * dk;
      std::fill(dqr, dqr + dk, 0.0f);
      std::fill(dkr, dkr + dk, 0.0f);
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        const float* sq = dq_shares + (h * T + t) * dk;
        const float* sk = dk_shares + (h * T + t) * dk;
        for (int64_t i = 0; i < dk; ++i) {
          dqr[i] += sq[i];
          dkr[i] += sk[i];
        }
      }
    }
  }
}

void kda_gate_backward(const Tensor& f, const Tensor& A_log, const Tensor& dt_bias,
                       float lower_bound, const Tensor& d_g, const Tensor& d_f,
                       const Tensor& d_A_log, const Tensor& d_dt_bias) {
  const int64_t T = f.dim(0), width = f.dim(1), H = A_log.numel(), per_head = width / H;
  const float* fp = f.data<float>();
  const float* dgp = d_g.data<float>();
  const float* bias = dt_bias.defined() ? dt_bias.data<float>() : nullptr;
  float* dfp = d_f.data<float>();
  // d g / d A_log per column, summed over tokens in token order (one thread per column).
  std::vector<float> da_col(width);
#pragma omp parallel for schedule(static) if (T * width > 65536)
  for (int64_t c = 0; c < width; ++c) {
    const float a = std::exp(A_log.data<float>()[c / per_head]);
    float da = 0.0f, db = 0.0f;
    for (int64_t t = 0; t < T; ++t) {
      const float x = fp[t * width + c] + (bias ? bias[c] : 0.0f);
      const float up = dgp[t * width + c];
      float dx, dalog;
      if (lower_bound == 0.0f) {
        // g = -a softplus(x): dg/dx = -a sigmoid(x), dg/dA_log = g.
        const float sp = x > 20.0f ? x : std::log1p(std::exp(x));
        dx = -a / (1.0f + std::exp(-x));
        dalog = -a * sp;
      } else {
        // g = lb sigmoid(a x): dg/dx = lb s (1 - s) a, dg/dA_log = lb s (1 - s) a x.
        const float s = 1.0f / (1.0f + std::exp(-a * x));
        dx = lower_bound * s * (1.0f - s) * a;
        dalog = dx * x;
      }
      dfp[t * width + c] = up * dx;
      db += up * dx;
      da += up * dalog;
    }
    da_col[c] = da;
    if (bias) d_dt_bias.data<float>()[c] += db;
  }
  for (int64_t h = 0; h < H; ++h) {
    float s = 0.0f;
    for (int64_t c = h * per_head; c < (h + 1) * per_head; ++c) s += da_col[c];
    d_A_log.data<float>()[h] += s;
  }
}

}  // namespace loom::cpu
