// A second stream for work that can run beside the caller's: a layer forks a branch that does not
// depend on what it enqueues next (an MoE layer's shared expert beside its router and routed
// experts), and joins it before reading the branch's result.
//
//   const Exec side = fork_side_stream(ex);  // side starts after everything enqueued on ex
//   ... the branch's ops on `side`; the caller's ops continue on `ex` meanwhile ...
//   join_side_stream(ex, side);              // ex continues after everything enqueued on side
//
// Why: at batch 1 a decode step is a chain of small kernels, each a few microseconds of launch,
// ramp and drain (bench/results/gpu-h200.md); two independent chains on two streams overlap
// those, and a CUDA graph captured across the fork keeps them as parallel branches.
//
// The branch must not use a workspace (side.workspace is null; the caller takes the branch's
// outputs and temporaries from its own workspace before forking, so nothing the branch uses is
// released while it runs) nor cuBLAS (whose handle is bound to the device's own stream): only
// Loom's kernels. One fork at a time per thread and device. On the host, side is ex itself with
// no workspace and join does nothing: the branch runs in order.
#pragma once

#include "kernels/exec.h"

namespace loom {

Exec fork_side_stream(const Exec& ex);
void join_side_stream(const Exec& ex, const Exec& side);

}  // namespace loom
