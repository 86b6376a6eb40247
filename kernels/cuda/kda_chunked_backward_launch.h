// Raw launcher of the chunked delta-rule backward on CUDA (kernels/cuda/kda_chunked_backward.cu).
// Like launch.h it includes no Loom or Abseil header; the Tensor-level entry point and its checks
// are kernels/cuda/kda_chunked_backward.h and backward.cc.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/backward_launch.h"

namespace loom::cuda::launch {

// f32 elements of the scratch kda_chunked_backward takes (a.scratch): per block (value head of a
// sequence) its chunk buffers (independent of T, about 0.6 MB at dk = dv = 128) and the state
// before every 64-token chunk of the longest sequence, then each value head's share of dq and dk
// over all T rows when value heads share a key head.
int64_t kda_chunked_backward_scratch_floats(int64_t T, int64_t Hk, int64_t Hv, int64_t dk,
                                            int64_t dv, int64_t num_seqs, int64_t max_T);

// The arguments of kda_recurrent_backward (the same contract) or, with a.cu_seqlens, of a packed
// batch (backward_launch.h), a.scratch holding kda_chunked_backward_scratch_floats(...) floats.
// One launch: a block per (value head, sequence).
void kda_chunked_backward(cudaStream_t stream, const KdaBackwardArgs& a);

}  // namespace loom::cuda::launch
