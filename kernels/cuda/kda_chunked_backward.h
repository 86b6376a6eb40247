// CUDA twin of kda_chunked_backward (kernels/kda_backward.h): the same contract (checked by that
// dispatcher; f32 tensors, gates per channel or per head), every tensor on the GPU and contiguous,
// enqueued on the Exec's stream. Where the forward's chunked kernels take the shape (dk, dv <= 128,
// multiples of 8, 16-byte aligned q, k, v): those kernels keep the state before each 64-token
// chunk, the state pass in reverse gives its gradient after each chunk, then every (chunk, value
// head) recomputes its A, P and U and runs its reverse mode in parallel. Otherwise one block per
// value head walks the chunks (kernels/cuda/kda_chunked_backward.cu; the host side beside the
// recurrent one in backward.cc). Equals the CPU twin to f32 rounding; nothing is summed with
// atomics, so results are the same from run to run. Scratch (a stream-ordered allocation): the
// states and their gradients (2 ceil(T / 64) per value head, f32 dk x dv), the forward's per-chunk
// workspace, chunk buffers (about 0.6 MB each at dk = dv = 128) per resident block and, when value
// heads share a key head, their shares of dq and dk.
#pragma once

#include "core/tensor.h"
#include "kernels/exec.h"

namespace loom::cuda {

void kda_chunked_backward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& g, const Tensor& beta, float scale,
                          const Tensor& initial_state, const Tensor& d_out,
                          const Tensor& d_final_state, const Tensor& dq, const Tensor& dk,
                          const Tensor& dv, const Tensor& dg, const Tensor& dbeta,
                          const Tensor& d_initial_state);

// kda_varlen_backward (kernels/kda_backward.h) in one call: every sequence of the packed batch
// from a zero state, each getting what a launch for it alone gives (the same bits). The
// sequential form takes one block per (value head, sequence), with the chunk states of the longest
// sequence (max_seqlen, which must bound every sequence) per block.
void kda_chunked_varlen_backward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& g, const Tensor& beta, float scale,
                                 const Tensor& cu_seqlens, int64_t max_seqlen, const Tensor& d_out,
                                 const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                 const Tensor& dg, const Tensor& dbeta);

}  // namespace loom::cuda
