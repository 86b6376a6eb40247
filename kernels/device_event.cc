// Backend dispatch for kernels/device_event.h: CUDA events in builds with CUDA, none on the host.
#include "kernels/device_event.h"

#include "core/status.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/context.h"
#include "kernels/cuda/event.h"
#endif

namespace loom {

DeviceEvent::DeviceEvent(Device device) {
#ifdef LOOM_WITH_CUDA
  if (device.is_cuda()) {
    event_ = std::shared_ptr<void>(cuda::create_timing_event(device.index), [](void* e) {
      cuda::destroy_event(static_cast<cudaEvent_t>(e));
    });
  }
#else
  (void)device;
#endif
}

void DeviceEvent::record(const Exec& ex) {
  if (empty()) return;
#ifdef LOOM_WITH_CUDA
  cuda::record_event(static_cast<cudaEvent_t>(event_.get()), cuda::stream_of(ex));
  recorded_ = true;
#else
  (void)ex;
#endif
}

bool DeviceEvent::reached() const {
  if (empty()) return true;
  if (!recorded_) return false;
#ifdef LOOM_WITH_CUDA
  return cuda::event_reached(static_cast<cudaEvent_t>(event_.get()));
#else
  return true;
#endif
}

void DeviceEvent::wait() const {
  if (empty() || !recorded_) return;
#ifdef LOOM_WITH_CUDA
  cuda::wait_event(static_cast<cudaEvent_t>(event_.get()));
#endif
}

double elapsed_ms(const DeviceEvent& from, const DeviceEvent& to) {
  if (from.empty() || to.empty()) return 0.0;
  LOOM_CHECK(from.recorded_ && to.recorded_, "elapsed_ms: an event was never recorded");
#ifdef LOOM_WITH_CUDA
  return cuda::event_elapsed_ms(static_cast<cudaEvent_t>(from.event_.get()),
                                static_cast<cudaEvent_t>(to.event_.get()));
#else
  return 0.0;
#endif
}

}  // namespace loom
