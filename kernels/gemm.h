// Dense matrix products. f32 on the CPU through OpenBLAS (multithreaded by OpenBLAS itself); weight
// matrices may be stored in bf16 or, on the CPU, block-scaled FP8 (a Placement's dtype,
// weights/parameter_arena.h).
#pragma once

#include "core/tensor.h"
#include "kernels/exec.h"

namespace loom {

// out[M, N] = beta * out + x[M, K] @ w[N, K]^T: a linear layer with PyTorch's weight layout
// ([out_features, in_features]). beta = 0 overwrites out (which may hold garbage), 1 accumulates.
// x, out: contiguous f32 (any leading dims, flattened to M rows); w: contiguous [N, K], f32 or
// bf16, or a stored FP8 matrix (f8e4m3 with its 128 x 128 block scales, core/fp8_matrix.h). A bf16
// or FP8 w is widened to f32 (FP8: times its block's scale, the dequantized value) and accumulated
// in f32 (cpu::sgemm_bf16_bt, cpu::sgemm_fp8_bt): in batch-invariant mode the same bits as the f32
// weight holding the same values, otherwise within f32 rounding of it. CUDA (kernels/cuda/gemm.h):
// f32 w through cuBLAS (no TF32); bf16 w with f32 x through Loom's GEMV up to 4 rows (x read
// unrounded) and cuBLASLt beyond (x staged as bf16 in the workspace, f32 accumulation); FP8 w
// (kernels/cuda/gemm_fp8.h) through Loom's GEMV up to 8 rows (dequantized in registers as the CPU
// does) and beyond through a block-scaled FP8 cuBLASLt GEMM on x quantized per 128-column group
// (DeepSeek-V3's recipe). bf16 x and out take bf16 or FP8 w; bf16 x also takes an f32 w into an
// f32 out (an MoE router's f32 logits from bf16 activations: the bits of the f32 product on x
// widened, one row read widened by the GEMV, more widened into the workspace first).
void linear_forward(const Exec& ex, const Tensor& x, const Tensor& w, const Tensor& out,
                    float beta = 0.0f);

// h = silu(x @ w_gate^T) * (x @ w_up^T): a SwiGLU FFN's first half. The same values as
// linear_forward into two tensors of h's dtype followed by silu_mul_forward (kernels/activation.h).
// On CUDA, bf16 weights with at most cuda::kGemvAutoRows rows outside batch-invariant mode run as
// one GEMV kernel that reads both matrices (a decode step's shared experts: three kernels before);
// everything else runs that composition on scratch from ex.workspace (or fresh tensors without
// one). x, h: [M, K] and [M, N] (f32, or bf16 on CUDA); w_gate, w_up: [N, K] of one dtype.
void linear_swiglu_forward(const Exec& ex, const Tensor& x, const Tensor& w_gate,
                           const Tensor& w_up, const Tensor& h);
// True when linear_swiglu_forward(ex, x, w_gate, w_up, h) runs as that one GEMV kernel (no
// workspace, no cuBLAS): the case above with contiguous f32 or bf16 x and h of matching shapes,
// and w_gate and w_up equally aligned (so both halves take the separate GEMV's path, hence its
// bits). False on the host.
bool linear_swiglu_is_gemv(const Exec& ex, const Tensor& x, const Tensor& w_gate,
                           const Tensor& w_up, const Tensor& h);

// True when linear_forward of `rows` rows with weight w runs as one of Loom's GEMV kernels, which
// takes no workspace and no cuBLAS handle (so it may run on a side stream, kernels/side_stream.h);
// linear_swiglu_forward with two such weights is then one kernel too. CUDA only: bf16 w, 1 to
// cuda::kGemvAutoRows rows, not batch-invariant; false on the host.
bool linear_is_gemv(const Exec& ex, const Tensor& w, int64_t rows);

// General product of row-major matrices: out[M, N] = alpha * op(a) @ op(b) + beta * out, where
// op(a) is a ([M, K]) or a^T (a is [K, M]), likewise b ([K, N] or [N, K] when trans_b).
void matmul(const Exec& ex, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
            const Tensor& out, float alpha = 1.0f, float beta = 0.0f);

}  // namespace loom
