// The CUDA-core varlen attention kernel's instantiations for fp8 pools (attention_simt.cuh): the
// vectors are dequantized into f32 tiles as they load, so the arithmetic is the f32 pools'.
#include "kernels/cuda/attention_simt.cuh"

namespace loom::cuda::simt {

void launch_fp8(cudaStream_t stream, const SimtParams& P, int qpw, size_t smem, int64_t max_items) {
  dispatch<float, true>(stream, P, qpw, smem, max_items);
}

}  // namespace loom::cuda::simt
