// CUDA graph capture on a DeviceContext's stream (kernels/graph.h is the backend-neutral API).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"

namespace loom::cuda {

struct CapturedGraph {
  cudaGraphExec_t exec = nullptr;
  size_t nodes = 0;
  size_t programmatic_edges = 0;  // PDL edges made at capture (kernels/cuda/pdl.h)
};

// Records what `enqueue` puts on `stream` (thread-local capture mode: other threads' CUDA calls
// neither join nor break the recording) and instantiates it, with programmatic edges into the
// PDL-aware kernels unless LOOM_CUDA_PDL=0 (kernels/cuda/pdl.h).
absl::StatusOr<CapturedGraph> capture(cudaStream_t stream, absl::FunctionRef<void()> enqueue);
void replay(cudaGraphExec_t exec, cudaStream_t stream);
void destroy(cudaGraphExec_t exec);

}  // namespace loom::cuda
