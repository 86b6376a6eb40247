// CUDA twins of the same-named kernels/ header: same contracts, every tensor argument on the GPU
// and contiguous, enqueued on the Exec's stream without synchronising. gate, up, out, table are
// each f32 or bf16 (math in f32, bf16 stores rounded to nearest even); silu_mul's out may alias
// gate only with the same dtype.
#pragma once

#include "core/tensor.h"
#include "kernels/cuda/check.h"
#include "kernels/exec.h"

namespace loom::cuda {

void silu_mul_forward(const Exec& ex, const Tensor& gate, const Tensor& up, const Tensor& out);

// ids may be on the host or on the GPU (table and out must be on the GPU).
// Out-of-range ids never read or write out of bounds. Host ids are checked on the host before
// the launch (abort naming the first bad id, as on the CPU). Device ids are checked in the kernel
// ("clamp and flag"): a bad id writes a zero row and flags its position; the host then reads the
// flag back (one 4-byte copy and a stream synchronisation per call) and aborts naming the id.
// ids_checked: device ids the caller validated; no flag, no download, no synchronisation.
void embedding_forward(const Exec& ex, const Tensor& ids, const Tensor& table, const Tensor& out,
                       bool ids_checked = false);

}  // namespace loom::cuda
