// Raw launcher of the chunked delta-rule backward on CUDA (kernels/cuda/kda_chunked_backward.cu).
// Like launch.h it includes no Loom or Abseil header; the Tensor-level entry point and its checks
// are kernels/cuda/kda_chunked_backward.h and backward.cc.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/backward_launch.h"

namespace loom::cuda::launch {

// f32 elements of the scratch kda_chunked_backward takes (a.scratch): per value head its chunk
// buffers (independent of T, about 0.6 MB at dk = dv = 128) and the state before every 64-token
// chunk, then each value head's share of dq and dk when value heads share a key head.
int64_t kda_chunked_backward_scratch_floats(int64_t T, int64_t Hk, int64_t Hv, int64_t dk,
                                            int64_t dv);

// The arguments of kda_recurrent_backward (the same contract), a.scratch holding
// kda_chunked_backward_scratch_floats(...) floats.
void kda_chunked_backward(cudaStream_t stream, const KdaBackwardArgs& a);

}  // namespace loom::cuda::launch
