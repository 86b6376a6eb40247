// Raw launcher of kernels/cuda/random_fill.cu (no Loom or Abseil header: see launch.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace loom::cuda::launch {

// out[i] = random_fill_math::uniform_value(key, first + i, center, step), as f32 (bf16 false) or
// rounded to bf16 (out then holds uint16_t), for i in [0, n).
void random_fill(cudaStream_t stream, void* out, bool bf16, int64_t n, uint64_t key, uint64_t first,
                 float center, float step);

}  // namespace loom::cuda::launch
