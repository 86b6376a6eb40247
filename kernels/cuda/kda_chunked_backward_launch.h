// Raw launcher of the chunked delta-rule backward on CUDA (kernels/cuda/kda_chunked_backward.cu).
// Like launch.h it includes no Loom or Abseil header; the Tensor-level entry point and its checks
// are kernels/cuda/kda_chunked_backward.h and backward.cc.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/backward_launch.h"

namespace loom::cuda::launch {

// f32 elements of the scratch kda_chunked_backward takes (a.scratch) for these arguments (every
// field but scratch set). The chunk-parallel form (the shapes the forward's chunked kernels take:
// dk, dv <= 128 and multiples of 8, q, k, v 16-byte aligned) keeps the state and its gradient
// before every 64-token chunk, the forward's per-chunk workspace and one set of chunk buffers
// (about 0.6 MB at dk = dv = 128; at dk, dv <= 64 only the [64, dk] ones, the rest in shared
// memory) per resident block; the sequential form one set of chunk buffers
// per (sequence, value head) and the states of the longest sequence. Both add each value head's
// share of dq and dk over all T rows when value heads share a key head.
int64_t kda_chunked_backward_scratch_floats(const KdaBackwardArgs& a);

// The arguments of kda_recurrent_backward (the same contract) or, with a.cu_seqlens, of a packed
// batch (backward_launch.h), a.scratch holding kda_chunked_backward_scratch_floats(a) floats.
// Chunk-parallel form: the forward's two passes, the state pass in reverse, then every (chunk,
// value head) at once. Sequential form: a block per (value head, sequence). Either way each
// sequence of a packed batch gets the bits a launch for it alone gives.
void kda_chunked_backward(cudaStream_t stream, const KdaBackwardArgs& a);

}  // namespace loom::cuda::launch
