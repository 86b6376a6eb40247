// Causal depthwise 1-D convolution (the short convolution of KDA and Gated DeltaNet layers).
//
// State layout: conv_state is [W-1, C], the last W-1 *inputs* of the sequence so far, oldest
// first (zeros for a new sequence). Feeding a sequence in any split (full prefill, chunks, single
// tokens) gives identical outputs and the same final state.
#pragma once

#include "core/tensor.h"
#include "kernels/exec.h"

namespace loom {

// For t in [0, T): out[t, c] = act(sum_{j<W} weight[c, j] * xpad[t + j, c]) where xpad is
// concat(conv_state, x) along time; then conv_state <- last W-1 rows of xpad.
// x, out: [T, C]; weight: [C, W]; conv_state: [W-1, C] (updated in place); act = SiLU if
// apply_silu, else identity. `out` must not alias `x`.
void causal_conv1d_forward(const Exec& ex, const Tensor& x, const Tensor& weight,
                           const Tensor& conv_state, bool apply_silu, const Tensor& out);

// One decode step for B sequences at once, each with its own state.
// x, out: [B, C]; weight: [C, W]; conv_states: [B, W-1, C] (updated in place).
void causal_conv1d_step(const Exec& ex, const Tensor& x, const Tensor& weight,
                        const Tensor& conv_states, bool apply_silu, const Tensor& out);

// The whole varlen batch of a layer in one call, each sequence against its own state in a pool of
// slots. Sequence b is rows [cu_seqlens[b], cu_seqlens[b + 1]) of x and out, and its state is
// conv_states[state_slots[b]]; it gets exactly what causal_conv1d_forward gives it alone (a batch
// of single tokens runs causal_conv1d_step's code once over the slots).
// x, out: [N, C]; weight: [C, W]; conv_states: [num_slots, W-1, C] (the named slots updated in
// place; no slot named twice); state_slots: i32 [B]; cu_seqlens: i64 [B + 1], 0 first, N last,
// non-decreasing. `out` must not alias `x`.
void causal_conv1d_varlen(const Exec& ex, const Tensor& x, const Tensor& weight,
                          const Tensor& conv_states, const Tensor& state_slots,
                          const Tensor& cu_seqlens, bool apply_silu, const Tensor& out);

}  // namespace loom
