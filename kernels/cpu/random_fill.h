// CPU implementation of kernels/random_fill.h (same contract, checked by kernels/random_fill.cc).
#pragma once

#include "core/tensor.h"
#include "kernels/random_fill.h"

namespace loom::cpu {

void random_fill(const Tensor& dst, const RandomFillParams& p);

}  // namespace loom::cpu
