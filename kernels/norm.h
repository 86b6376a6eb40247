// Normalisations and their backward passes. All compute in f32; inputs and outputs are contiguous
// f32 [N, D] unless noted. On CUDA the forward passes' x and out may each be bf16 instead (read
// widened, stored rounded to nearest even); the CPU and the backward passes take f32 only.
//
// Backward convention (as in llm.c): a gradient of an activation is written (`dx = ...`), a
// gradient of a parameter is accumulated (`dw += ...`) so that micro-batches and weights shared by
// several calls (KDA's o_norm over heads) add up without a separate sum. Parameter gradients are
// summed over rows in a fixed order: same inputs, same bits, whatever the thread count.
#pragma once

#include "core/tensor.h"
#include "kernels/exec.h"

namespace loom {

// out = (weight_offset + w) * x / sqrt(mean(x^2) + eps), row by row. weight_offset is 0 for the
// usual RMSNorm and 1 for qwen3_next's zero-centred weights. `out` may alias `x` (same dtype).
// x, out: [N, D], f32 or (CUDA) bf16 each; w: [D] f32.
void rmsnorm_forward(const Exec& ex, const Tensor& x, const Tensor& w, float eps,
                     float weight_offset, const Tensor& out);

// h += delta, then out = rmsnorm_forward(h): a residual add and the next sublayer's pre-norm in
// one pass over the row (one kernel on CUDA). The same bits as add_inplace(h, delta) followed by
// rmsnorm_forward(h, ..., out) when delta and out have one dtype and delta is 16-byte aligned
// whenever h and out are (the norm's vector width, hence its summation order, is the same then;
// the model's final norm, out = h f32 with a bf16 delta, sums in 8-element units where the plain
// f32 norm takes 4). h, delta, out: [N, D]; h f32 or
// (CUDA) bf16, delta and out each f32 or (CUDA) bf16; `out` may alias `h` (same dtype), delta
// aliases neither.
void add_rmsnorm_forward(const Exec& ex, const Tensor& h, const Tensor& delta, const Tensor& w,
                         float eps, float weight_offset, const Tensor& out);

// Per-head L2 normalisation as KDA/GDN use it: out = x / sqrt(sum(x^2) + eps) * scale over the
// last dimension. x, out: [..., d] contiguous (any leading shape), f32 or (CUDA) bf16 each; `out`
// may alias `x` (same dtype).
void l2norm_forward(const Exec& ex, const Tensor& x, float eps, float scale, const Tensor& out);

// Backward of rmsnorm_forward at input x (the forward's input, not its output):
//   dx = rstd * (g - xhat * mean(g * xhat)),  g = (weight_offset + w) * dout,  xhat = x * rstd;
//   dw += sum over rows of dout * xhat.
// x, dout, dx: [N, D] (any leading shape, D last); w, dw: [D]. dx may alias x or dout. Uses an
// [N] f32 temporary (from ex.workspace when there is one).
void rmsnorm_backward(const Exec& ex, const Tensor& x, const Tensor& w, float eps,
                      float weight_offset, const Tensor& dout, const Tensor& dx, const Tensor& dw);

// Backward of l2norm_forward at input x: with n = sqrt(sum(x^2) + eps) per row,
//   dx = scale / n * (dout - x * (x . dout) / n^2).
// x, dout, dx: [..., d]; dx may alias x or dout.
void l2norm_backward(const Exec& ex, const Tensor& x, float eps, float scale, const Tensor& dout,
                     const Tensor& dx);

}  // namespace loom
