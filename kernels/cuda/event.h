// CUDA timing events (kernels/device_event.h is the backend-neutral API).
#pragma once

#include <cuda_runtime_api.h>

namespace loom::cuda {

// An event with timing (not cudaEventDisableTiming) on device `index`.
cudaEvent_t create_timing_event(int index);
void destroy_event(cudaEvent_t event);
void record_event(cudaEvent_t event, cudaStream_t stream);
// cudaEventQuery: true when reached, false while pending; aborts on any other error.
bool event_reached(cudaEvent_t event);
void wait_event(cudaEvent_t event);
double event_elapsed_ms(cudaEvent_t from, cudaEvent_t to);

}  // namespace loom::cuda
