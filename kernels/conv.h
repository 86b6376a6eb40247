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

}  // namespace loom
