// Normalisations. All compute in f32; inputs and outputs are contiguous f32 [N, D] unless noted.
#pragma once

#include "core/tensor.h"
#include "kernels/exec.h"

namespace loom {

// out = (weight_offset + w) * x / sqrt(mean(x^2) + eps), row by row. weight_offset is 0 for the
// usual RMSNorm and 1 for qwen3_next's zero-centred weights. `out` may alias `x`.
// x, out: [N, D]; w: [D].
void rmsnorm_forward(const Exec& ex, const Tensor& x, const Tensor& w, float eps,
                     float weight_offset, const Tensor& out);

// Per-head L2 normalisation as KDA/GDN use it: out = x / sqrt(sum(x^2) + eps) * scale over the
// last dimension. x, out: [..., d] contiguous (any leading shape); `out` may alias `x`.
void l2norm_forward(const Exec& ex, const Tensor& x, float eps, float scale, const Tensor& out);

}  // namespace loom
