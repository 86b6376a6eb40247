// CUDA half of kernels/side_stream.h: per thread and device, a second stream and the two events
// that fork it from and join it to the caller's stream.
#pragma once

#include "kernels/exec.h"

namespace loom::cuda {

// The side stream (as void*, for Exec::stream), after it has been made to wait for `ex`'s stream.
void* fork_side_stream(const Exec& ex);
// Makes `ex`'s stream wait for everything enqueued on side.stream.
void join_side_stream(const Exec& ex, const Exec& side);

}  // namespace loom::cuda
