// Backend dispatch for kernels/side_stream.h.
#include "kernels/side_stream.h"

#include "core/status.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/side_stream.h"
#endif

namespace loom {

Exec fork_side_stream(const Exec& ex) {
  Exec side = ex;
  side.workspace = nullptr;
#ifdef LOOM_WITH_CUDA
  if (ex.device.is_cuda()) side.stream = cuda::fork_side_stream(ex);
#endif
  return side;
}

void join_side_stream(const Exec& ex, const Exec& side) {
  LOOM_CHECK(side.device == ex.device, "join_side_stream: a side stream of another device");
#ifdef LOOM_WITH_CUDA
  if (ex.device.is_cuda()) cuda::join_side_stream(ex, side);
#endif
}

}  // namespace loom
