// CPU implementation of rope_forward and rope_backward (kernels/rope.h).
#pragma once

#include <vector>

#include "kernels/rope.h"

namespace loom::cpu {

// rope_forward (inverse = false) and rope_backward (inverse = true: the transposed rotation), in
// place on x. Contracts checked by kernels/rope.cc.
void rope_apply(const Tensor& x, const Tensor& positions, const RopeTable& table,
                int64_t dim_offset, bool inverse);

}  // namespace loom::cpu
