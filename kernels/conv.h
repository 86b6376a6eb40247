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

// Backward of causal_conv1d_forward over one sequence (depthwise: every channel on its own).
// x: [T, C], the forward's input; weight: [C, W]; initial_state: [W-1, C], the conv_state as it
// was *before* the forward (which updates it in place), or undefined for a sequence that started
// from zeros; dout: [T, C]; dfinal_state: [W-1, C], the gradient reaching the state the forward
// left (a later chunk of the same sequence), or undefined for none. Writes dx: [T, C] (must not
// alias x; may alias dout) and dinitial_state: [W-1, C] (undefined: not wanted); accumulates
// dweight: [C, W] += (a parameter gradient). With pre = the convolution before the activation,
//   dpre = dout * silu'(pre) (or dout);  dxpad[p] = sum_j weight[:, j] * dpre[p - j];
//   dweight[:, j] += sum_t dpre[t] * xpad[t + j]
// where xpad = concat(initial_state, x) and dxpad = concat(dinitial_state, dx) (plus dfinal_state
// on its last W-1 rows). Every sum runs in t order inside a channel; threads split channels: same
// bits whatever the thread count.
void causal_conv1d_backward(const Exec& ex, const Tensor& x, const Tensor& weight,
                            const Tensor& initial_state, bool apply_silu, const Tensor& dout,
                            const Tensor& dfinal_state, const Tensor& dx, const Tensor& dweight,
                            const Tensor& dinitial_state);

// causal_conv1d_backward over the trainer's packed batch: sequence b is rows
// [cu_seqlens[b], cu_seqlens[b + 1]) of x, dout and dx, each started from zeros with its final
// state unused (cu_seqlens: i64 [B + 1] on ex's device, 0 first, N last, non-decreasing). dx is
// overwritten, dweight accumulated. The CPU runs causal_conv1d_backward per sequence (dweight
// summed sequence by sequence); CUDA one pass over all rows, which sums dweight over fixed chunks
// of rows across sequence boundaries: the same terms in another order.
void causal_conv1d_varlen_backward(const Exec& ex, const Tensor& x, const Tensor& weight,
                                   const Tensor& cu_seqlens, bool apply_silu, const Tensor& dout,
                                   const Tensor& dx, const Tensor& dweight);

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
// non-decreasing. `out` must not alias `x`. On CUDA, x, out and conv_states may each also be bf16
// (f32 arithmetic; out and the states rounded to nearest even as they are stored: the states of a
// bf16 x are its own rows, exact); weight stays f32. The other ops here are f32 only.
void causal_conv1d_varlen(const Exec& ex, const Tensor& x, const Tensor& weight,
                          const Tensor& conv_states, const Tensor& state_slots,
                          const Tensor& cu_seqlens, bool apply_silu, const Tensor& out);

}  // namespace loom
