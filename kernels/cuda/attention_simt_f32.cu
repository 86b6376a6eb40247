// The CUDA-core varlen attention kernel's instantiations for f32 pools (attention_simt.cuh).
#include "kernels/cuda/attention_simt.cuh"

namespace loom::cuda::simt {

void launch_f32(cudaStream_t stream, const SimtParams& P, int qpw, size_t smem, int64_t max_items) {
  dispatch<float>(stream, P, qpw, smem, max_items);
}

}  // namespace loom::cuda::simt
