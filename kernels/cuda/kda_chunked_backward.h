// CUDA twin of kda_chunked_backward (kernels/kda_backward.h): the same contract (checked by that
// dispatcher; f32 tensors, gates per channel or per head), every tensor on the GPU and contiguous,
// enqueued on the Exec's stream. One block per value head walks the chunks: a forward sweep keeps
// the state before each 64-token chunk, then each chunk, last first, recomputes its A, P and U from
// that state and runs its reverse mode (kernels/cuda/kda_chunked_backward.cu; the host side beside
// the recurrent one in backward.cc). Equals the CPU twin to f32 rounding; nothing is summed with
// atomics, so results are the same from run to run. Scratch (a stream-ordered allocation): about
// 0.6 MB per value head at dk = dv = 128, plus the ceil(T / 64) chunk states per value head and,
// when value heads share a key head, their shares of dq and dk.
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

// kda_varlen_backward (kernels/kda_backward.h) in one launch: every sequence of the packed batch
// from a zero state, one block per (value head, sequence), each doing what a launch for its
// sequence alone does (the same bits). Scratch: the chunk buffers per block, the chunk states of
// the longest sequence (max_seqlen, which must bound every sequence) per block.
void kda_chunked_varlen_backward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& g, const Tensor& beta, float scale,
                                 const Tensor& cu_seqlens, int64_t max_seqlen, const Tensor& d_out,
                                 const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                 const Tensor& dg, const Tensor& dbeta);

}  // namespace loom::cuda
