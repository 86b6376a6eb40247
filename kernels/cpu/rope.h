// CPU implementation of rope_forward (kernels/rope.h).
#pragma once

#include <vector>

#include "kernels/rope.h"

namespace loom::cpu {

void rope_forward(const Tensor& x, const Tensor& positions, const RopeTable& table,
                  int64_t dim_offset);

}  // namespace loom::cpu
