// CUDA twins of kernels/gemm.h: same contracts, every tensor argument on the GPU (contiguous),
// enqueued on the Exec's stream without synchronising. beta = 0 never reads out (it may hold NaN).
//
// Kernels, by weight type and Exec::batch_invariant:
//   f32 weights:  cuBLAS cublasSgemm in CUBLAS_DEFAULT_MATH (true f32, no TF32) on the cuBLAS
//                 handle of the Exec's device context; one row (decode) through Loom's GEMV.
//                 Batch-invariant: Loom's f32 FMA kernel (gemm_invariant.cu), also for matmul.
//   bf16 weights: x f32 or bf16, out f32 or bf16, f32 accumulation. Up to kGemvAutoRows rows:
//                 Loom's GEMV, x used as it is (f32 x is not rounded). More rows: x rounded to
//                 bf16 (f32 x is staged as bf16 in ex.workspace, or a fresh buffer without one),
//                 then one cuBLASLt matmul (bf16 x bf16 -> f32 compute, on the device's cuBLASLt
//                 handle and workspace), or Loom's tensor-core kernel where cuBLASLt cannot take
//                 the rows (k % 8 != 0, unaligned). Batch-invariant: always Loom's tensor-core
//                 kernel (gemm_bf16.cu), x rounded to bf16 for every row count.
#pragma once

#include "core/tensor.h"
#include "kernels/cuda/check.h"
#include "kernels/exec.h"

namespace loom::cuda {

// x [.., K] (f32, or bf16 with bf16 w), w [N, K] (f32 or bf16), out [.., N] (f32, or bf16 with
// bf16 w).
void linear_forward(const Exec& ex, const Tensor& x, const Tensor& w, const Tensor& out,
                    float beta);
// f32 only.
void matmul(const Exec& ex, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
            const Tensor& out, float alpha, float beta);

// Rows up to which linear_forward runs a bf16 weight through the GEMV (outside batch-invariant
// mode). H200, weight 4096 x 4096 (f32 x, cast included where needed): GEMV 16.0 / 16.9 / 23.7 /
// 42.0 us at 1 / 2 / 4 / 8 rows, cuBLASLt 25.5-27 us at every row count up to 64.
inline constexpr int64_t kGemvAutoRows = 4;

// Which kernel runs linear_forward for a bf16 w: kAuto is linear_forward's choice (above); the
// others force one, for tests and benchmarks: kGemv (at most 8 rows), kCublasLt (aborts where
// cuBLASLt cannot take the rows), kTiled (Loom's batch-invariant tensor-core kernel).
enum class Bf16Gemm { kAuto, kGemv, kCublasLt, kTiled };
void linear_forward_bf16(const Exec& ex, const Tensor& x, const Tensor& w, const Tensor& out,
                         float beta, Bf16Gemm kernel = Bf16Gemm::kAuto);

// linear_swiglu_forward's fused case (kernels/gemm.h): bf16 w_gate and w_up, at most kGemvAutoRows
// rows, not batch-invariant, contiguous operands, x and h f32 or bf16. Runs it and returns true,
// or returns false (the caller composes it) for anything else.
bool linear_swiglu_gemv(const Exec& ex, const Tensor& x, const Tensor& w_gate, const Tensor& w_up,
                        const Tensor& h);
// Whether linear_swiglu_gemv would run (and return true) for these operands.
bool linear_swiglu_gemv_applies(const Exec& ex, const Tensor& x, const Tensor& w_gate,
                                const Tensor& w_up, const Tensor& h);

// `batch` row-major GEMMs at fixed element strides, one cuBLAS call: c_i[m, n] = a_i[m, k]
// op(b_i), op(b_i) = b_i [k, n] (trans_b false) or b_i^T with b_i [n, k] (trans_b true); a_i = a +
// i * stride_a elements with row stride lda, likewise b and c. Element types: every one f32 (true
// f32, CUBLAS_DEFAULT_MATH), or a and b bf16 with c f32 or bf16; f32 accumulation either way.
// Not batch invariant (cuBLAS picks its kernel by shape). For per-head projections (MLA's).
enum class GemmElem { kF32, kBF16 };
void gemm_strided_batched(const Exec& ex, int64_t batch, int64_t m, int64_t n, int64_t k,
                          const void* a, GemmElem a_type, int64_t lda, int64_t stride_a,
                          const void* b, GemmElem b_type, int64_t ldb, int64_t stride_b,
                          bool trans_b, void* c, GemmElem c_type, int64_t ldc, int64_t stride_c);

}  // namespace loom::cuda
