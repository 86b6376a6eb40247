// Backend dispatch for kernels/graph.h: CUDA graphs in builds with CUDA, none on the host.
#include "kernels/graph.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/device.h"
#include "kernels/cuda/graph.h"
#endif

namespace loom {

bool graphs_supported(Device device) {
#ifdef LOOM_WITH_CUDA
  return device.is_cuda();
#else
  (void)device;
  return false;
#endif
}

absl::StatusOr<DeviceGraph> capture_graph(const Exec& ex, absl::FunctionRef<void()> enqueue) {
  if (!graphs_supported(ex.device))
    return absl::InvalidArgumentError(
        absl::StrCat("no device graphs on ", device_name(ex.device), " in this build"));
#ifdef LOOM_WITH_CUDA
  LOOM_ASSIGN_OR_RETURN(cuda::CapturedGraph g, cuda::capture(cuda::stream_of(ex), enqueue));
  DeviceGraph out;
  out.nodes_ = g.nodes;
  out.programmatic_edges_ = g.programmatic_edges;
  out.exec_ = std::shared_ptr<void>(
      g.exec, [](void* p) { cuda::destroy(static_cast<cudaGraphExec_t>(p)); });
  return out;
#else
  std::abort();
#endif
}

void DeviceGraph::replay(const Exec& ex) const {
  LOOM_CHECK(exec_ != nullptr, "DeviceGraph::replay: nothing was recorded");
#ifdef LOOM_WITH_CUDA
  cuda::replay(static_cast<cudaGraphExec_t>(exec_.get()), cuda::stream_of(ex));
#else
  no_kernel_for(ex, "DeviceGraph::replay");
#endif
}

}  // namespace loom
