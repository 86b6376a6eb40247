// CPU implementation of kernels/attnres.h.
#pragma once

#include "core/tensor.h"

namespace loom::cpu {

void attnres_aggregate(const Tensor& sources, const Tensor& query, const Tensor& key_norm,
                       const Tensor& out_norm, float eps, const Tensor& out);

}  // namespace loom::cpu
