// Dense matrix products. f32 on the CPU through OpenBLAS (multithreaded by OpenBLAS itself).
#pragma once

#include "core/tensor.h"
#include "kernels/exec.h"

namespace loom {

// out[M, N] = beta * out + x[M, K] @ w[N, K]^T: a linear layer with PyTorch's weight layout
// ([out_features, in_features]). beta = 0 overwrites out (which may hold garbage), 1 accumulates.
void linear_forward(const Exec& ex, const Tensor& x, const Tensor& w, const Tensor& out,
                    float beta = 0.0f);

// General product of row-major matrices: out[M, N] = alpha * op(a) @ op(b) + beta * out, where
// op(a) is a ([M, K]) or a^T (a is [K, M]), likewise b ([K, N] or [N, K] when trans_b).
void matmul(const Exec& ex, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
            const Tensor& out, float alpha = 1.0f, float beta = 0.0f);

}  // namespace loom
