// Elementwise activations and the embedding lookup. Contiguous f32 unless noted.
#pragma once

#include <cmath>

#include "core/tensor.h"
#include "kernels/exec.h"

namespace loom {

inline float sigmoidf(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float siluf(float x) { return x / (1.0f + std::exp(-x)); }
// torch.nn.functional.softplus with beta 1, threshold 20 (returns x above the threshold).
inline float softplusf(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// out = silu(gate) * up. gate, up, out: same shape; out may alias gate.
void silu_mul_forward(const Exec& ex, const Tensor& gate, const Tensor& up, const Tensor& out);

// out[t, :] = table[ids[t], :]. ids: [T] i32 or i64 (each in [0, V), checked); table: [V, D]
// f32; out: [T, D].
void embedding_forward(const Exec& ex, const Tensor& ids, const Tensor& table, const Tensor& out);

}  // namespace loom
