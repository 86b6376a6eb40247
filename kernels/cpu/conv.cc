#include "kernels/cpu/conv.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/activation.h"
#include "kernels/cpu/varlen.h"

namespace loom::cpu {
namespace {

// One output row: out[c] = act(sum_j wt[j][c] * rows[j][c]), j in order 0..W-1. Prefill, chunked
// and single-step paths all go through this one function, so every split of a sequence produces
// bit-identical outputs.
// Channels [c0, c1) only (rows, wt and out are indexed by absolute channel; wt has row stride C).
inline void conv_row(const float* const* rows, const float* wt, int64_t W, int64_t C, int64_t c0,
                     int64_t c1, bool apply_silu, float* out) {
  for (int64_t c = c0; c < c1; ++c) out[c] = 0.0f;
  for (int64_t j = 0; j < W; ++j) {
    const float* wj = wt + j * C;
    const float* xj = rows[j];
    for (int64_t c = c0; c < c1; ++c) out[c] += wj[c] * xj[c];
  }
  if (apply_silu)
    for (int64_t c = c0; c < c1; ++c) out[c] = siluf(out[c]);
}

// weight [C, W] -> [W, C] so the channel loop is contiguous.
std::vector<float> transpose_weight(const Tensor& weight) {
  const int64_t C = weight.dim(0), W = weight.dim(1);
  const float* w = weight.data<float>();
  std::vector<float> wt(static_cast<size_t>(W * C));
  for (int64_t c = 0; c < C; ++c)
    for (int64_t j = 0; j < W; ++j) wt[j * C + c] = w[c * W + j];
  return wt;
}

// Work is split into (row, channel block) items so that short inputs with many channels (decode,
// small chunks) still spread over the threads.
constexpr int64_t kChannelBlock = 512;

// One token for each of B sequences: row b of x against the state at states + state_index(b) *
// (W-1) * C, shifted in place. The batched decode step of causal_conv1d_step and of a varlen batch
// of single tokens; per row the same conv_row as the prefill, so the results are bit-identical.
template <typename StateIndex>
void conv_step_rows(const float* xp, const std::vector<float>& wt, int64_t B, int64_t C, int64_t W,
                    float* states, StateIndex state_index, bool apply_silu, float* op) {
  const int64_t P = W - 1;
  const int64_t nblk = (C + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static) if (B * C * W > 65536)
  for (int64_t item = 0; item < B * nblk; ++item) {
    const int64_t b = item / nblk, c0 = (item % nblk) * kChannelBlock;
    const int64_t c1 = std::min(C, c0 + kChannelBlock);
    float* st = states + state_index(b) * P * C;
    const float* xb = xp + b * C;
    const float* rows[64];
    std::vector<const float*> many;
    const float** r = rows;
    if (W > 64) {
      many.resize(static_cast<size_t>(W));
      r = many.data();
    }
    for (int64_t j = 0; j < P; ++j) r[j] = st + j * C;
    r[P] = xb;
    conv_row(r, wt.data(), W, C, c0, c1, apply_silu, op + b * C);
    // Shift this block's window: drop the oldest row, append x.
    for (int64_t j = 0; j + 1 < P; ++j)
      std::copy(st + (j + 1) * C + c0, st + (j + 1) * C + c1, st + j * C + c0);
    if (P > 0) std::copy(xb + c0, xb + c1, st + (P - 1) * C + c0);
  }
}

}  // namespace

void causal_conv1d_forward(const Tensor& x, const Tensor& weight, const Tensor& conv_state,
                           bool apply_silu, const Tensor& out) {
  LOOM_CHECK_F32(x);
  LOOM_CHECK_F32(weight);
  LOOM_CHECK_F32(conv_state);
  LOOM_CHECK_F32(out);
  LOOM_CHECK(x.ndim() == 2 && weight.ndim() == 2, "causal_conv1d_forward: x %s weight %s",
             x.describe().c_str(), weight.describe().c_str());
  const int64_t T = x.dim(0), C = x.dim(1), W = weight.dim(1);
  LOOM_CHECK(W >= 1, "causal_conv1d_forward: width %lld", static_cast<long long>(W));
  LOOM_CHECK_SHAPE(weight, C, W);
  LOOM_CHECK_SHAPE(conv_state, W - 1, C);
  LOOM_CHECK_SHAPE(out, T, C);
  LOOM_CHECK(out.raw() != x.raw() || T * C == 0, "causal_conv1d_forward: out aliases x");
  const std::vector<float> wt = transpose_weight(weight);
  const float* xp = x.data<float>();
  float* sp = conv_state.data<float>();
  float* op = out.data<float>();
  const int64_t P = W - 1;
  // Row p of xpad = concat(conv_state, x).
  auto xpad = [&](int64_t p) -> const float* { return p < P ? sp + p * C : xp + (p - P) * C; };
  const int64_t nblk = (C + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static) if (T * C * W > 65536)
  for (int64_t item = 0; item < T * nblk; ++item) {
    const int64_t t = item / nblk, c0 = (item % nblk) * kChannelBlock;
    const int64_t c1 = std::min(C, c0 + kChannelBlock);
    const float* rows[64];
    std::vector<const float*> many;
    const float** r = rows;
    if (W > 64) {
      many.resize(static_cast<size_t>(W));
      r = many.data();
    }
    for (int64_t j = 0; j < W; ++j) r[j] = xpad(t + j);
    conv_row(r, wt.data(), W, C, c0, c1, apply_silu, op + t * C);
  }
  // New state: the last P rows of xpad (rows T .. T+P-1). When T < P part of it is the old state,
  // which shifts down; copy forwards (source index >= destination index) so nothing is clobbered.
  for (int64_t i = 0; i < P; ++i) {
    const int64_t p = T + i;
    const float* src = xpad(p);
    if (src != sp + i * C) std::copy(src, src + C, sp + i * C);
  }
}

// Per block of channels (threads split the blocks; inside one, every sum runs in t order, so the
// result is the same whatever the thread count), four passes over the sequence, with dx holding
// dpre until the last pass overwrites it row by row:
//   1. dpre[t] = dout[t] * silu'(pre[t]) (or dout[t]), pre recomputed exactly as the forward does;
//   2. dweight[:, j] += sum_t dpre[t] * xpad[t + j];
//   3. dinitial_state[p] = sum_{j <= p, p - j < T} weight[:, j] * dpre[p - j] (+ dfinal_state);
//   4. t ascending: dx[t] = sum_j weight[:, j] * dpre[t + P - j] (+ dfinal_state): row t of dpre
//      is last needed by dx[t] itself, so the overwrite is safe.
void causal_conv1d_backward(const Tensor& x, const Tensor& weight, const Tensor& initial_state,
                            bool apply_silu, const Tensor& dout, const Tensor& dfinal_state,
                            const Tensor& dx, const Tensor& dweight, const Tensor& dinitial_state) {
  const int64_t T = x.dim(0), C = x.dim(1), W = weight.dim(1), P = W - 1;
  const float* xp = x.data<float>();
  const float* wp = weight.data<float>();  // [C, W]
  const float* s0 = initial_state.defined() ? initial_state.data<float>() : nullptr;
  const float* gp = dout.data<float>();
  const float* dfin = dfinal_state.defined() ? dfinal_state.data<float>() : nullptr;
  float* dxp = dx.data<float>();
  float* dwp = dweight.data<float>();
  float* ds0 = dinitial_state.defined() ? dinitial_state.data<float>() : nullptr;
  // xpad[p][c], zero for a state row when there is no initial state.
  auto xpad = [&](int64_t p, int64_t c) -> float {
    if (p >= P) return xp[(p - P) * C + c];
    return s0 ? s0[p * C + c] : 0.0f;
  };
  constexpr int64_t kBlock = 128;
  const int64_t nblk = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (T * C * W > 65536)
  for (int64_t blk = 0; blk < nblk; ++blk) {
    const int64_t c0 = blk * kBlock, c1 = std::min(C, c0 + kBlock);
    // 1. dpre into dx (dx may alias dout: element (t, c) is read before it is written).
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t c = c0; c < c1; ++c) {
        const float g = gp[t * C + c];
        if (!apply_silu) {
          dxp[t * C + c] = g;
          continue;
        }
        float pre = 0.0f;  // conv_row's order: j = 0 .. W-1 from 0
        for (int64_t j = 0; j < W; ++j) pre += wp[c * W + j] * xpad(t + j, c);
        const float s = 1.0f / (1.0f + std::exp(-pre));
        const float sn = 1.0f / (1.0f + std::exp(pre));  // 1 - s without its cancellation
        dxp[t * C + c] = g * (s * (1.0f + pre * sn));
      }
    }
    // 2. dweight.
    for (int64_t c = c0; c < c1; ++c) {
      for (int64_t j = 0; j < W; ++j) {
        float acc = 0.0f;
        for (int64_t t = 0; t < T; ++t) acc += dxp[t * C + c] * xpad(t + j, c);
        dwp[c * W + j] += acc;
      }
    }
    // 3. dinitial_state (rows p < P of dxpad).
    if (ds0) {
      for (int64_t p = 0; p < P; ++p) {
        for (int64_t c = c0; c < c1; ++c) {
          float acc = 0.0f;
          for (int64_t j = 0; j <= p; ++j)
            if (p - j < T) acc += wp[c * W + j] * dxp[(p - j) * C + c];
          if (dfin && p >= T) acc += dfin[(p - T) * C + c];
          ds0[p * C + c] = acc;
        }
      }
    }
    // 4. dx in place, t ascending (rows p = t + P of dxpad).
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t c = c0; c < c1; ++c) {
        float acc = 0.0f;
        for (int64_t j = 0; j < W; ++j) {
          const int64_t q = t + P - j;  // dpre row; rows >= t are still dpre
          if (q < T) acc += wp[c * W + j] * dxp[q * C + c];
        }
        const int64_t i = t + P - T;  // the final state's row i is xpad row T + i = t + P
        if (dfin && i >= 0) acc += dfin[i * C + c];
        dxp[t * C + c] = acc;
      }
    }
  }
}

void causal_conv1d_step(const Tensor& x, const Tensor& weight, const Tensor& conv_states,
                        bool apply_silu, const Tensor& out) {
  LOOM_CHECK_F32(x);
  LOOM_CHECK_F32(weight);
  LOOM_CHECK_F32(conv_states);
  LOOM_CHECK_F32(out);
  LOOM_CHECK(x.ndim() == 2 && weight.ndim() == 2, "causal_conv1d_step: x %s weight %s",
             x.describe().c_str(), weight.describe().c_str());
  const int64_t B = x.dim(0), C = x.dim(1), W = weight.dim(1);
  LOOM_CHECK(W >= 1, "causal_conv1d_step: width %lld", static_cast<long long>(W));
  LOOM_CHECK_SHAPE(weight, C, W);
  LOOM_CHECK_SHAPE(conv_states, B, W - 1, C);
  LOOM_CHECK_SHAPE(out, B, C);
  LOOM_CHECK(out.raw() != x.raw() || B * C == 0, "causal_conv1d_step: out aliases x");
  conv_step_rows(
      x.data<float>(), transpose_weight(weight), B, C, W, conv_states.data<float>(),
      [](int64_t b) { return b; }, apply_silu, out.data<float>());
}

void causal_conv1d_varlen(const Tensor& x, const Tensor& weight, const Tensor& conv_states,
                          const Tensor& state_slots, const Tensor& cu_seqlens, bool apply_silu,
                          const Tensor& out) {
  LOOM_CHECK_F32(x);
  LOOM_CHECK_F32(weight);
  LOOM_CHECK_F32(conv_states);
  LOOM_CHECK_F32(out);
  LOOM_CHECK(x.ndim() == 2 && weight.ndim() == 2 && conv_states.ndim() == 3,
             "causal_conv1d_varlen: x %s weight %s conv_states %s", x.describe().c_str(),
             weight.describe().c_str(), conv_states.describe().c_str());
  const int64_t N = x.dim(0), C = x.dim(1), W = weight.dim(1);
  LOOM_CHECK(W >= 1, "causal_conv1d_varlen: width %lld", static_cast<long long>(W));
  LOOM_CHECK_SHAPE(weight, C, W);
  LOOM_CHECK_SHAPE(conv_states, conv_states.dim(0), W - 1, C);
  LOOM_CHECK_SHAPE(out, N, C);
  LOOM_CHECK(out.raw() != x.raw() || N * C == 0, "causal_conv1d_varlen: out aliases x");
  const int64_t B = check_cu_seqlens("causal_conv1d_varlen", cu_seqlens, N);
  check_state_slots("causal_conv1d_varlen", state_slots, B, conv_states.dim(0));
  const int64_t* cu = cu_seqlens.data<int64_t>();
  const int32_t* slots = state_slots.data<int32_t>();
  // A decode batch (one token each) is one parallel step over all sequences.
  bool decode = true;
  for (int64_t b = 0; b < B; ++b) decode &= cu[b + 1] - cu[b] == 1;
  if (decode) {
    conv_step_rows(
        x.data<float>(), transpose_weight(weight), B, C, W, conv_states.data<float>(),
        [slots](int64_t b) { return static_cast<int64_t>(slots[b]); }, apply_silu,
        out.data<float>());
    return;
  }
  for (int64_t b = 0; b < B; ++b)
    causal_conv1d_forward(x.slice(0, cu[b], cu[b + 1]), weight, conv_states.select(slots[b]),
                          apply_silu, out.slice(0, cu[b], cu[b + 1]));
}

}  // namespace loom::cpu
