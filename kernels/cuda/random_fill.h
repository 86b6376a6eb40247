// CUDA twin of kernels/random_fill.h: the same bits as the host fill, written on the device (a
// model's weights are never staged on the host), enqueued on the Exec's stream.
#pragma once

#include "core/tensor.h"
#include "kernels/exec.h"
#include "kernels/random_fill.h"

namespace loom::cuda {

void random_fill(const Exec& ex, const Tensor& dst, const RandomFillParams& p);

}  // namespace loom::cuda
