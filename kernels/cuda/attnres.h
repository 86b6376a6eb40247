// CUDA twin of kernels/attnres.h's forward: same contract, every tensor argument on the GPU and
// contiguous (f32, but for out, which may be bf16), enqueued on the Exec's stream without
// synchronising. One block per token; each output row depends on its own token's sources only
// (batch-invariant). D <= 16384.
#pragma once

#include "core/tensor.h"
#include "kernels/cuda/check.h"
#include "kernels/exec.h"

namespace loom::cuda {

void attnres_aggregate(const Exec& ex, const Tensor& sources, const Tensor& query,
                       const Tensor& key_norm, const Tensor& out_norm, float eps,
                       const Tensor& out);

}  // namespace loom::cuda
