// CPU implementation of kernels/attnres.h.
#pragma once

#include "core/tensor.h"

namespace loom::cpu {

void attnres_aggregate(const Tensor& sources, const Tensor& query, const Tensor& key_norm,
                       const Tensor& out_norm, float eps, const Tensor& out);

// Contracts checked by kernels/attnres.cc. scratch: f32 of attnres_backward_scratch's shape.
void attnres_aggregate_backward(const Tensor& sources, const Tensor& query, const Tensor& key_norm,
                                const Tensor& out_norm, float eps, const Tensor& dout,
                                const Tensor& dsources, const Tensor& dquery,
                                const Tensor& dkey_norm, const Tensor& dout_norm,
                                const Tensor& scratch);
Shape attnres_backward_scratch(int64_t s, int64_t n, int64_t d);

}  // namespace loom::cpu
