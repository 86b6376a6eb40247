// Raw launchers of Loom's own GEMM kernels (kernels/cuda/gemm_bf16.cu, gemm_invariant.cu), behind
// kernels/cuda/gemm.cc. Like launch.h it includes no Loom or Abseil header (nvcc parses it); bf16
// arrays are passed as their raw bits (uint16_t). Every launcher enqueues on `stream`, checks the
// launch and never synchronises. Matrices are row-major; ld* are row strides in elements.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace loom::cuda::launch {

// xb[r, c] = bf16(x[r, c]) (round to nearest even) for c < k, 0 for k <= c < ldxb: the bf16 copy
// of f32 activations that the bf16 GEMMs read. x is [m, k] with row stride ldx >= k; ldxb % 8 ==
// 0, ldxb >= k.
void cast_rows_f32_bf16(cudaStream_t stream, const float* x, int64_t ldx, int64_t m, int64_t k,
                        uint16_t* xb, int64_t ldxb);

// Element type of an activation or output array of the bf16-weight kernels.
enum class Elem : int { kF32, kBF16 };

// out[r, j] = sum_k x[r, k] w[j, k] (+ beta out[r, j]) for r < m <= kGemvBf16MaxRows: the decode
// case of a bf16 weight w [n, k] (row stride k). 1 to 8 warps per weight row, a split of k
// chosen from n and k only (16-byte streaming loads of w when k % 8 == 0 and the pointers are
// 16-byte aligned), x read as it is (f32 or bf16, never rounded), products and sums in f32.
// beta = 0 never reads out.
inline constexpr int kGemvBf16MaxRows = 8;
void gemv_bf16(cudaStream_t stream, const uint16_t* w, const void* x, Elem x_type, int64_t ldx,
               void* out, Elem out_type, int64_t ldo, int64_t m, int64_t n, int64_t k, float beta);
// h[r, j] = silu(g) * u with g = sum_k x[r, k] w_gate[j, k] and u likewise with w_up, each rounded
// to h's type first: the bits of two gemv_bf16 calls into h's type and silu_mul, in one kernel.
void gemv_bf16_swiglu(cudaStream_t stream, const uint16_t* w_gate, const uint16_t* w_up,
                      const void* x, Elem x_type, int64_t ldx, void* h, Elem h_type, int64_t ldh,
                      int64_t m, int64_t n, int64_t k);

// out[r, j] = sum_k x[r, k] w[j, k] (+ beta out[r, j]) with x bf16 [m, k] (row stride ldx), w bf16
// [n, k] (row stride k), on tensor cores (mma.sync m16n8k16, f32 accumulation) in a fixed K order:
// batch-invariant (see the comment in gemm_bf16.cu). Any sizes and alignments (16-byte cp.async
// where the rows allow it). beta = 0 never reads out.
void gemm_bf16_tiled(cudaStream_t stream, const uint16_t* x, int64_t ldx, const uint16_t* w,
                     void* out, Elem out_type, int64_t m, int64_t n, int64_t k, float beta);

// c[m, n] = alpha * op(a) @ op(b) + beta * c in f32, row-major: op(a)[i, p] is a[i * lda + p], or
// a[p * lda + i] when trans_a; op(b)[p, j] is b[p * ldb + j], or b[j * ldb + p] when trans_b. Each
// element is one f32 FMA chain over p = 0 .. k-1 in order: batch-invariant (gemm_invariant.cu).
// k = 0 writes beta * c. beta = 0 never reads c.
void sgemm_invariant(cudaStream_t stream, bool trans_a, bool trans_b, int64_t m, int64_t n,
                     int64_t k, float alpha, const float* a, int64_t lda, const float* b,
                     int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace loom::cuda::launch
