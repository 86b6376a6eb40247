#include "kernels/cuda/event.h"

#include "kernels/cuda/context.h"
#include "kernels/cuda/launch.h"

namespace loom::cuda {

cudaEvent_t create_timing_event(int index) {
  const DeviceGuard on(index);
  cudaEvent_t e = nullptr;
  LOOM_CUDA_CHECK(cudaEventCreate(&e));
  return e;
}

void destroy_event(cudaEvent_t event) {
  if (event != nullptr) LOOM_CUDA_CHECK(cudaEventDestroy(event));
}

void record_event(cudaEvent_t event, cudaStream_t stream) {
  LOOM_CUDA_CHECK(cudaEventRecord(event, stream));
}

bool event_reached(cudaEvent_t event) {
  const cudaError_t e = cudaEventQuery(event);
  if (e == cudaErrorNotReady) return false;
  LOOM_CUDA_CHECK(e);
  return true;
}

void wait_event(cudaEvent_t event) { LOOM_CUDA_CHECK(cudaEventSynchronize(event)); }

double event_elapsed_ms(cudaEvent_t from, cudaEvent_t to) {
  float ms = 0.0f;
  LOOM_CUDA_CHECK(cudaEventElapsedTime(&ms, from, to));
  return ms;
}

}  // namespace loom::cuda
