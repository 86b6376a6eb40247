// The per-head pieces of KDA's decode preparation (nvcc only), shared by kda_decode_prepare
// (kernels/cuda/kda_decode_prep.cu: a warp a task over the whole batch) and kda_decode_step
// (kernels/cuda/kda_decode_step.cu: the preparation, recurrence and output norm of one head in one
// block), so that both store the same bits: the short convolution with SiLU and its state update,
// a q or k head's l2 norm in norm.cu's order, the decay gate and sigmoid(beta). The file comment of
// kda_decode_prep.cu says which separate kernel each piece replays.
#pragma once

#include "kernels/cuda/kda_fused_launch.h"
#include "kernels/cuda/norm_order.cuh"

namespace loom::cuda::kda_prep {

using launch::KdaDecodePrepArgs;

constexpr int kChunk = 128;  // v channels, gates or betas a warp task: 4 per lane
constexpr int kMaxDk = launch::kKdaDecodePrepMaxDk;
constexpr int kMaxNormWarps = 2;  // norm.cu's reduction of a row of at most 256: 32 or 64 threads

// The convolution with SiLU (f32, before rounding) of N channels of one row, ch[i] where ok[i],
// moving the slot's state along. st: the slot's state (pool + slot * (W-1) * C), null for a bad
// slot (its rows read as NaN, nothing stored). All loads come first, then the arithmetic, then
// the state stores, so the loads of the N channels are in flight together (interleaved, each
// store would keep the next channel's loads waiting: the compiler cannot tell the rows apart).
// No other thread touches these channels of this slot. KW: the width W at compile time, or 0 for
// any width (one channel after another).
template <int KW, int N, typename TX, typename TS>
__device__ __forceinline__ void conv_channels(const TX* xrow, const float* __restrict__ w, TS* st,
                                              const int64_t (&ch)[N], const bool (&ok)[N],
                                              int64_t C, int W_runtime, float (&y)[N]) {
  const float kNaN = __int_as_float(0x7fc00000);
  if constexpr (KW > 0) {
    constexpr int P = KW - 1;
    float xv[N], s[N][P > 0 ? P : 1];
#pragma unroll
    for (int i = 0; i < N; ++i) {
      xv[i] = ok[i] ? dev::ld(xrow + ch[i]) : 0.0f;
#pragma unroll
      for (int j = 0; j < P; ++j)
        s[i][j] = ok[i] && st != nullptr ? dev::ld(st + j * C + ch[i]) : kNaN;
    }
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const float* wc = w + ch[i] * KW;
      float acc = 0.0f;
      if (ok[i]) {
#pragma unroll
        for (int j = 0; j < P; ++j) acc = fmaf(wc[j], s[i][j], acc);
        acc = fmaf(wc[P], xv[i], acc);
      }
      y[i] = dev::silu(acc);
    }
    if (st == nullptr) return;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if (!ok[i]) continue;
#pragma unroll
      for (int j = 0; j + 1 < P; ++j) dev::st(st + j * C + ch[i], s[i][j + 1]);
      if constexpr (P > 0) dev::st(st + (P - 1) * C + ch[i], xv[i]);
    }
  } else {
    const int P = W_runtime - 1;
    for (int i = 0; i < N; ++i) {
      y[i] = 0.0f;
      if (!ok[i]) continue;
      const float* wc = w + ch[i] * W_runtime;
      float acc = 0.0f;
      for (int j = 0; j < P; ++j) {
        const float s = st != nullptr ? dev::ld(st + j * C + ch[i]) : kNaN;
        acc = fmaf(wc[j], s, acc);
        if (st != nullptr && j > 0) dev::st(st + (j - 1) * C + ch[i], s);
      }
      const float xv = dev::ld(xrow + ch[i]);
      acc = fmaf(wc[P], xv, acc);
      if (st != nullptr && P > 0) dev::st(st + (P - 1) * C + ch[i], xv);
      y[i] = dev::silu(acc);
    }
  }
}

// One q or k head: the convolution of its channels c0 .. c0 + dk - 1 and their l2 norm into out
// (the head's dk elements). V: norm.cu's unit width for this head (1, or 16 bytes of TX); the
// lane holds the units lane + 32 m (m < kM), which norm.cu's thread lane + 32 (m mod nw) reads.
template <int KW, typename TX, typename TS, int V>
__device__ __forceinline__ void head_task(const KdaDecodePrepArgs& a, const TX* xrow, TS* st,
                                          bool pad, int64_t c0, int64_t C, TX* out, int nw,
                                          int lane) {
  constexpr int kM = kMaxDk / (32 * V);
  const int units = a.dk / V;
  float vals[kM][V];
  int64_t ch[kM * V];
  bool ok[kM * V];
#pragma unroll
  for (int m = 0; m < kM; ++m)
#pragma unroll
    for (int j = 0; j < V; ++j) {
      ch[m * V + j] = c0 + (lane + 32 * m) * V + j;
      ok[m * V + j] = !pad && lane + 32 * m < units;
    }
  float y[kM * V];
  conv_channels<KW>(xrow, a.conv_w, st, ch, ok, C, a.W, y);  // pad: all zero (SiLU(0))
  float part[kMaxNormWarps] = {};
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    if (lane + 32 * m < units) {
      const bool second = nw == 2 && (m & 1);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float x = dev::as_stored<TX>(y[m * V + j]);
        vals[m][j] = x;
        // norm.cu's `ss += v * v`, which nvcc contracts to this fma (-fmad=true, its default);
        // spelled out so that the two accumulators' branches cannot share one rounded product.
        if (second) {
          part[1] = fmaf(x, x, part[1]);
        } else {
          part[0] = fmaf(x, x, part[0]);
        }
      }
    }
  }
  const float ss = dev::norm_order_sum(part, nw, lane);
  const float mul = a.qk_scale / sqrtf(ss + a.qk_eps);
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    const int u = lane + 32 * m;
    if (u < units) {
#pragma unroll
      for (int j = 0; j < V; ++j) vals[m][j] *= mul;
      dev::st_vec<V>(out + u * V, vals[m]);
    }
  }
}

__device__ __forceinline__ float ld_flag(const void* p, int64_t i, bool bf16) {
  return bf16 ? dev::ld(static_cast<const dev::bf16*>(p) + i)
              : dev::ld(static_cast<const float*>(p) + i);
}

// kda_gate_kernel's formula (kernels/cuda/kda.cu) for element e of row b's gates.
__device__ __forceinline__ float gate_value(const KdaDecodePrepArgs& a, int64_t b, int64_t e) {
  const int64_t per_head = a.gate_width / a.Hv;
  const int64_t idx = b * a.gate_width + e;
  const float x = ld_flag(a.f, idx, a.f_bf16) + (a.dt_bias != nullptr ? a.dt_bias[e] : 0.0f);
  const float ah = expf(a.A_log[e / per_head]);
  return a.lower_bound == 0.0f ? -ah * dev::softplus(x) : a.lower_bound * dev::sigmoid(ah * x);
}

// sigmoid(beta[idx]) (elementwise.cu's sigmoid), before it is stored in beta's type.
__device__ __forceinline__ float beta_value(const KdaDecodePrepArgs& a, int64_t idx) {
  return dev::sigmoid(ld_flag(a.beta, idx, a.beta_bf16));
}

}  // namespace loom::cuda::kda_prep
