// Backward passes of the delta-rule family (kernels/kda.h), for the trainer. Tensors and the
// recurrence are those of kda.h; every d_* tensor has the shape of the tensor it is the gradient
// of and is overwritten.
//
// The forward keeps no per-token states (a [T, Hv, dk, dv] tape would be T times the state), so
// the backward recomputes them: one forward sweep stores the state every kKdaBackwardSegment
// tokens, then each segment, last first, replays its tokens' states and runs the reverse
// recurrence through them. Memory: ceil(T / segment) + segment states per value head.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/tensor.h"
#include "kernels/exec.h"
#include "kernels/kda.h"

namespace loom {

inline constexpr int64_t kKdaBackwardSegment = 64;

// Gradients of o = kda_recurrent_forward(q, k, v, g, beta, scale, initial_state) and of its final
// state. `initial_state` is the state before the first token (not modified). `d_final_state`
// [Hv, dk, dv] may be undefined (the final state is not used); `d_initial_state` may be undefined
// (not wanted). dq and dk sum over the value heads that share a key head, in head order, so the
// result does not depend on the thread count.
void kda_recurrent_backward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& g, const Tensor& beta, float scale,
                            const Tensor& initial_state, const Tensor& d_out,
                            const Tensor& d_final_state, const Tensor& dq, const Tensor& dk,
                            const Tensor& dv, const Tensor& dg, const Tensor& dbeta,
                            const Tensor& d_initial_state);

// The same gradients in the chunked (WY/UT) form of kda_chunked_forward, O(T dk dv) work in GEMMs:
// a first pass keeps only the state before each kKdaChunk-token chunk (ceil(T / 64) states per
// value head), then the chunks, last first, recompute their within-chunk quantities from that state
// and run the chunk's reverse mode (kernels/cpu/kda_chunked_backward.cc has the equations). No
// factor exp(-cumsum g) is formed: the reverse mode's exponentials are all of differences <= 0
// (only the boundary pass, like the forward, lets a diagonal block's factors reach e^80). Equals
// kda_recurrent_backward to f32 rounding; dq and dk sum the value heads' shares in head order, as
// the recurrence does, so results do not depend on the thread count. Subnormal f32 intermediates
// (decayed keys) are flushed to zero while it runs (x86 FTZ/DAZ: 3.4x faster, and below 1e-38 of
// the terms they join). Temporaries come from ex.workspace when there is one (else one allocation):
// kda_chunked_backward_workspace_bytes. On CUDA: kernels/cuda/kda_chunked_backward.h (the same
// equations, every chunk in parallel once the states are known; scratch from a stream-ordered
// device allocation).
void kda_chunked_backward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& g, const Tensor& beta, float scale,
                          const Tensor& initial_state, const Tensor& d_out,
                          const Tensor& d_final_state, const Tensor& dq, const Tensor& dk,
                          const Tensor& dv, const Tensor& dg, const Tensor& dbeta,
                          const Tensor& d_initial_state);

// Bytes kda_chunked_backward takes from the host workspace for one call of these sizes on this
// thread: the chunk-boundary states, per-head dq/dk shares when Hv > Hk, and per-thread chunk
// buffers (a function of the OpenMP thread count).
size_t kda_chunked_backward_workspace_bytes(int64_t T, int64_t Hk, int64_t Hv, int64_t dk,
                                            int64_t dv);

// Which backward the trainer runs for a sequence of `tokens` rows on `ex`: the form its forward
// took (kda_varlen_takes_recurrence: the recurrence for a few tokens and in batch-invariant mode,
// the chunked form otherwise), on the CPU and on CUDA alike. On the CPU the chunked backward is
// the faster one from T = 4 (4.5x there, 5x at T = 1024; bench/kda_backward_bench.cc,
// docs/trainer.md); on an H200 bench/results/trainer-gpu-h200.md has both forms' times.
inline bool kda_backward_takes_recurrence(const Exec& ex, int64_t tokens) {
  return kda_varlen_takes_recurrence(tokens, ex.batch_invariant);
}

// The trainer's backward over a packed batch: sequence b is rows [cu_seqlens[b], cu_seqlens[b + 1])
// of every tensor (q, k, v, g, beta, d_out and the gradients as above with T = N rows), each
// started from a zero state and its final state unused. cu_seqlens: i64 [B + 1] on ex's device, 0
// first, N last, non-decreasing; max_seqlen: at least every sequence's length (the host's copy of
// what cu_seqlens says; CUDA sizes its launch and scratch by it). The CPU, and CUDA in
// batch-invariant mode, run each sequence in the form kda_backward_takes_recurrence picks for it;
// CUDA otherwise runs the chunked form of every sequence in one launch (a block per value head of
// each sequence: the bits of one kda_chunked_backward call per sequence).
void kda_varlen_backward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& g, const Tensor& beta, float scale, const Tensor& cu_seqlens,
                         int64_t max_seqlen, const Tensor& d_out, const Tensor& dq,
                         const Tensor& dk, const Tensor& dv, const Tensor& dg, const Tensor& dbeta);

// Gradients of g = kda_gate_forward(f, A_log, dt_bias, lower_bound): d_f is written; d_A_log [H]
// and d_dt_bias (undefined when dt_bias is) are parameter gradients, accumulated. Sums over tokens
// run in token order.
void kda_gate_backward(const Exec& ex, const Tensor& f, const Tensor& A_log, const Tensor& dt_bias,
                       float lower_bound, const Tensor& d_g, const Tensor& d_f,
                       const Tensor& d_A_log, const Tensor& d_dt_bias);

}  // namespace loom
