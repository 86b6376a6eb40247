#include "kernels/cuda/graph.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/launch.h"

namespace loom::cuda {

absl::StatusOr<CapturedGraph> capture(cudaStream_t stream, absl::FunctionRef<void()> enqueue) {
  LOOM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  enqueue();
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  if (end != cudaSuccess) {
    (void)cudaGetLastError();  // the capture's error is not sticky: clear it for later checks
    if (graph != nullptr) cudaGraphDestroy(graph);
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA graph capture failed: ", cudaGetErrorString(end)));
  }
  CapturedGraph out;
  LOOM_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &out.nodes));
  const cudaError_t inst = cudaGraphInstantiate(&out.exec, graph, 0);
  cudaGraphDestroy(graph);  // the instance keeps what it needs
  if (inst != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA graph instantiation failed: ", cudaGetErrorString(inst)));
  }
  return out;
}

void replay(cudaGraphExec_t exec, cudaStream_t stream) {
  LOOM_CUDA_CHECK(cudaGraphLaunch(exec, stream));
}

void destroy(cudaGraphExec_t exec) {
  if (exec != nullptr) LOOM_CUDA_CHECK(cudaGraphExecDestroy(exec));
}

}  // namespace loom::cuda
