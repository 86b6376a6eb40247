// Elementwise activations and the embedding lookup, with their backward passes. Contiguous f32
// unless noted; on CUDA the forward passes' tensors (gate, up, out; table, out) may each be bf16
// instead (computed in f32, bf16 stores rounded to nearest even). The CPU kernels and the backward
// passes take f32 only. Backward convention (llm.c's): activation gradients are written, parameter
// gradients (the embedding table's) accumulated.
#pragma once

#include <cmath>

#include "core/tensor.h"
#include "kernels/exec.h"

namespace loom {

inline float sigmoidf(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float siluf(float x) { return x / (1.0f + std::exp(-x)); }
// torch.nn.functional.softplus with beta 1, threshold 20 (returns x above the threshold).
inline float softplusf(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// out = silu(gate) * up. gate, up, out: same shape; out may alias gate (same dtype).
void silu_mul_forward(const Exec& ex, const Tensor& gate, const Tensor& up, const Tensor& out);

// Whether embedding_forward reports ids outside [0, V). kChecked: the caller validated every id
// already (the model's step data is checked on the host before it is uploaded); an id out of range
// still reads a zero row but is not reported, so on a GPU the call neither allocates nor waits for
// the device (what a CUDA graph's capture needs, and one host synchronisation less per step).
enum class EmbeddingIds : bool { kVerify, kChecked };

// out[t, :] = table[ids[t], :]. ids: [T] i32 or i64 (each in [0, V), checked unless `ids_state`
// says the caller did); table: [V, D]; out: [T, D] (on CUDA, a bf16 table widens into an f32 out
// and the reverse rounds).
void embedding_forward(const Exec& ex, const Tensor& ids, const Tensor& table, const Tensor& out,
                       EmbeddingIds ids_state = EmbeddingIds::kVerify);

// Backward of silu_mul_forward: dgate = dout * up * silu'(gate), dup = dout * silu(gate), with
// silu'(g) = sigmoid(g) * (1 + g * (1 - sigmoid(g))). All the same shape; elementwise, so dgate and
// dup may each alias gate, up or dout (not each other).
void silu_mul_backward(const Exec& ex, const Tensor& gate, const Tensor& up, const Tensor& dout,
                       const Tensor& dgate, const Tensor& dup);

// Backward of embedding_forward: dtable[ids[t], :] += dout[t, :] for every t (a parameter
// gradient: accumulated). Deterministic: every row of dtable receives its tokens' rows in token
// order, whatever the thread count (threads split the columns). ids: [T] i32/i64 (checked in
// [0, V) before anything is written; on the host or ex.device, as for embedding_forward);
// dout: [T, D]; dtable: [V, D].
void embedding_backward(const Exec& ex, const Tensor& ids, const Tensor& dout,
                        const Tensor& dtable);

}  // namespace loom
