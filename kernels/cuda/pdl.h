// Programmatic dependent launch (PDL) for the decode graphs: which kernels may start before their
// predecessor in a captured graph has finished, and how much of their weights they pull into L2
// while they wait.
//
// Why: at batch 1 a decode step is ~580 small kernels, and HBM idles through each one's ramp and
// drain (bench/results/gpu-h200.md, issue 15). A GEMV's weights do not depend on its input, so it
// can stream them into L2 before its input exists. A kernel opts in by (1) touching memory before
// its wait only through L2 prefetches (L2 is the GPU's point of coherence: a line prefetched
// there before the predecessor writes it is updated by that write, never stale), (2) executing
// dev::pdl_wait() in every thread before any other read or write (kernels/cuda/pdl.cuh), and (3)
// calling mark_pdl_kernel() with its function before its first launch. capture() (graph.cc) then
// turns the single incoming kernel -> kernel edge of each marked kernel node into a programmatic
// one from the predecessor's launch-completion port: the marked kernel's blocks are scheduled once
// all of its predecessor's blocks have started, and griddepcontrol.wait holds them until the
// predecessor has finished and its writes are visible. Outside a programmatic edge the wait returns
// at once, so eager launches are unchanged.
//
// This header includes no Loom or Abseil header (nvcc compiles the .cu files that include it).
#pragma once

#include <cstdint>

namespace loom::cuda {

// Records `kernel` (a __global__ function's address) as PDL-aware, unless its loaded code is
// older than sm_90 (no wait compiled in). Thread-safe; idempotent.
void mark_pdl_kernel(const void* kernel);
bool is_pdl_kernel(const void* kernel);

// Whether capture() makes programmatic edges: on unless LOOM_CUDA_PDL=0 (read once per process).
bool pdl_enabled();

// How many leading rows of `row_bytes` each a marked GEMV prefetches into L2 before its wait:
// LOOM_CUDA_PDL_PREFETCH_MB (default kDefaultPrefetchMiB, read once per process) of weights, at
// most n rows; 0 when PDL is off. The blocks that are resident while the predecessor runs are the
// ones that gain; rows past the budget are read from HBM as before.
inline constexpr int64_t kDefaultPrefetchMiB = 16;
int64_t pdl_prefetch_rows(int64_t n, int64_t row_bytes);

}  // namespace loom::cuda

// At a PDL-aware kernel's launch site (a .cu file): records `kernel`, a compile-time constant
// function, once per call site (and per template instance of the enclosing function).
#define LOOM_MARK_PDL_KERNEL(kernel)                                                  \
  do {                                                                                \
    static const bool loom_pdl_marked_ =                                              \
        (::loom::cuda::mark_pdl_kernel(reinterpret_cast<const void*>(kernel)), true); \
    (void)loom_pdl_marked_;                                                           \
  } while (0)
