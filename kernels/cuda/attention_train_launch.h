// Raw launchers of the tiled causal attention for training (kernels/cuda/attention_train.cu). Like
// launch.h it includes no Loom or Abseil header; causal_attention_forward / _backward in
// backward_launch.h call these for the head sizes they take and keep their one-row-a-block
// kernels for the others.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace loom::cuda::launch {

// Head sizes of the tiled kernels: d (query/key) up to 192, dv up to 128.
inline constexpr int64_t kAttnTiledMaxDim = 192, kAttnTiledMaxValueDim = 128;
inline bool attention_tiled_supported(int64_t d, int64_t dv) {
  return d >= 1 && dv >= 1 && d <= kAttnTiledMaxDim && dv <= kAttnTiledMaxValueDim;
}

// The contracts of causal_attention_forward / _backward (backward_launch.h): q [T, Hq, d],
// k [T, Hkv, d], v [T, Hkv, dv], out and d_out [T, Hq, dv], lse and d_rows [T, Hq], f32 on the
// device; one sequence of T rows with cu null, else cu (i64 [nseq + 1], device) row offsets with
// every sequence at most max_T rows. No length limit.
void causal_attention_tiled_forward(cudaStream_t stream, const float* q, const float* k,
                                    const float* v, float scale, int64_t T, int64_t Hq, int64_t Hkv,
                                    int64_t d, int64_t dv, float* out, float* lse,
                                    const int64_t* cu, int64_t nseq, int64_t max_T);
void causal_attention_tiled_backward(cudaStream_t stream, const float* q, const float* k,
                                     const float* v, const float* out, const float* lse,
                                     const float* d_out, float scale, int64_t T, int64_t Hq,
                                     int64_t Hkv, int64_t d, int64_t dv, float* d_rows, float* dq,
                                     float* dk, float* dvv, const int64_t* cu, int64_t nseq,
                                     int64_t max_T);

}  // namespace loom::cuda::launch
