// DeviceGraph: the device work one callback enqueues on an Exec's stream, recorded once and
// replayed as a whole (a CUDA graph): one launch instead of every kernel's, so a decode step of
// a few hundred small kernels stops paying the host's launch cost for each
// (engine/decode_graphs.h).
//
// A replay runs the recorded kernels with the arguments they had when recorded: the same device
// addresses and the same grid sizes. What changes between replays must therefore live at fixed
// addresses that the kernels read (step data uploaded before the replay, the workspace), and the
// recorded work may neither allocate nor wait for the device on the host.
#pragma once

#include <cstddef>
#include <memory>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "kernels/exec.h"

namespace loom {

class DeviceGraph {
 public:
  DeviceGraph() = default;

  // Enqueues the recorded work on `ex`'s stream (the stream it was recorded on), in order with
  // what is already there.
  void replay(const Exec& ex) const;
  bool empty() const { return exec_ == nullptr; }
  // Kernel, copy and memset nodes recorded.
  size_t nodes() const { return nodes_; }
  // Edges made programmatic at capture (programmatic dependent launch, kernels/cuda/pdl.h): a
  // GEMV's blocks start while its predecessor runs and prefetch their weights into L2.
  size_t programmatic_edges() const { return programmatic_edges_; }

 private:
  friend absl::StatusOr<DeviceGraph> capture_graph(const Exec&, absl::FunctionRef<void()>);
  std::shared_ptr<void> exec_;  // the instantiated graph (cudaGraphExec_t), destroyed with it
  size_t nodes_ = 0;
  size_t programmatic_edges_ = 0;
};

// Whether work on `device` can be recorded (a CUDA device in a build with the CUDA backend).
bool graphs_supported(Device device);

// Records what `enqueue` puts on `ex`'s stream without running it. Only the calling thread's work
// is recorded; an operation that cannot be (a synchronous copy, an allocation, a wait for the
// stream) fails inside `enqueue` through its own check. FailedPrecondition when the driver
// refuses the recording; InvalidArgument on a device without graphs.
absl::StatusOr<DeviceGraph> capture_graph(const Exec& ex, absl::FunctionRef<void()> enqueue);

}  // namespace loom
