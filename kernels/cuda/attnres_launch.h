// Raw launcher of the Block-AttnRes aggregation kernel (kernels/cuda/attnres.cu). Like launch.h
// this header includes no Loom or Abseil header, so nvcc never parses Abseil; the Tensor-level
// entry point and its checks are in kernels/cuda/attnres.{h,cc}.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace loom::cuda::launch {

// attnres_aggregate: sources [S, N, D], query, key_norm, out_norm [D], all f32; out [N, D] f32,
// or bf16 when out_bf16 (rounded to nearest even). D <= kAttnResMaxDim.
inline constexpr int64_t kAttnResMaxDim = 16384;
void attnres_aggregate(cudaStream_t stream, const float* sources, const float* query,
                       const float* key_norm, const float* out_norm, float eps, void* out,
                       bool out_bf16, int64_t S, int64_t N, int64_t D);

}  // namespace loom::cuda::launch
