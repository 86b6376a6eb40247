// DeviceEvent: a mark that a device records when its stream reaches it, in order with the work
// enqueued before it, timed on the device's own clock (a CUDA event). Two marks measure how long
// the device took over the work between them, or how long it sat idle waiting for the host
// (engine/step_clock.h). On the host there is nothing to mark: every call is a no-op.
#pragma once

#include <memory>

#include "kernels/exec.h"

namespace loom {

class DeviceEvent {
 public:
  DeviceEvent() = default;
  // A timing event of `device` (its backend must be initialised: device_available); an empty
  // event on the host or in a build without the device's backend.
  explicit DeviceEvent(Device device);

  bool empty() const { return event_ == nullptr; }
  // Enqueues the mark on `ex`'s stream (ex.device must be the event's device). Recording again
  // moves the mark.
  void record(const Exec& ex);
  // True once the stream has reached the last recorded mark (never blocks). False if never
  // recorded; true for an empty event.
  bool reached() const;
  // Blocks until the stream has reached the last recorded mark.
  void wait() const;

 private:
  friend double elapsed_ms(const DeviceEvent& from, const DeviceEvent& to);
  std::shared_ptr<void> event_;  // cudaEvent_t, destroyed with the last copy
  bool recorded_ = false;
};

// Milliseconds of the device's clock from `from` to `to` (negative when `to` came first); both
// recorded on one device and reached. 0 for empty events.
double elapsed_ms(const DeviceEvent& from, const DeviceEvent& to);

}  // namespace loom
