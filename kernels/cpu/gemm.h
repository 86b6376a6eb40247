// CPU implementations of kernels/gemm.h (same contracts), on OpenBLAS.
#pragma once

#include <string>

#include "core/tensor.h"

namespace loom::cpu {

// w f32, bf16 or a stored fp8 matrix (contracts checked in kernels/gemm.cc).
void linear_forward(const Tensor& x, const Tensor& w, const Tensor& out, float beta);
void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& out,
            float alpha, float beta);

// Raw row-major sgemm: c[m, n] = alpha * op(a) @ op(b) + beta * c with leading dimensions.
// Handles m, n or k = 0 (k = 0 scales c by beta; beta = 0 writes zeros, never reading c).
// Must not be called from inside an OpenMP parallel region (OpenBLAS threads itself).
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// c[m, n] = a[m, k] @ b^T + beta * c with b [n, k] bf16 (row stride ldb): f32 activations, f32
// accumulation. Up to 8 rows the row-invariant kernel reads b as bf16 and widens it in registers
// (bandwidth-bound: half the bytes of f32 weights). More rows widen panels of b into bounded
// per-thread scratch and multiply them in f32: with the row-invariant kernel (256 KiB panels) in
// batch-invariant mode and up to 32 rows, with OpenBLAS (at most 4 MiB panels) beyond.
// Batch-invariant mode gives exactly the bits sgemm gives for b widened to f32 (so do 2 to 8
// rows); otherwise the result is within f32 rounding of it (sgemm uses sgemv for one row and
// OpenBLAS from 9 rows; OpenBLAS blocks panels rather than the whole b). Same threading rule as
// sgemm.
void sgemm_bf16_bt(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const uint16_t* b,
                   int64_t ldb, float beta, float* c, int64_t ldc);
// c[m, n] = a[m, k] @ b^T + beta * c with b [n, k] float8_e4m3fn (row stride ldb) in 128 x 128
// blocks, block (i, j)'s scale at scale_inv[i * ld_scale + j] (core/fp8_matrix.h): f32
// activations, f32 accumulation. Panels of b are dequantized into per-thread scratch, each value
// f32(q) * scale as one f32 product, and multiplied as sgemm_bf16_bt multiplies its widened panels
// (the row-invariant kernel for every row count up to 32 and for any in batch-invariant mode,
// OpenBLAS beyond): in batch-invariant mode the same bits as sgemm on the dequantized f32 matrix,
// within f32 rounding of it otherwise. Same threading rule as sgemm.
void sgemm_fp8_bt(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const uint8_t* b,
                  int64_t ldb, const float* scale_inv, int64_t ld_scale, float beta, float* c,
                  int64_t ldc);
// c = a @ w^T + beta * c for a weight w [n, k] (row stride ldw) stored as f32 (sgemm), bf16
// (sgemm_bf16_bt) or e4m3 (sgemm_fp8_bt, with w_scale_inv its [ceil(n / 128), ceil(k / 128)]
// scale grid): the GEMM of a linear layer or an expert.
void sgemm_weight(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const void* w,
                  DType w_dtype, int64_t ldw, float beta, float* c, int64_t ldc,
                  const float* w_scale_inv = nullptr);

// The BLAS in use and how it threads, for startup logs: "OpenBLAS 0.3.21 ... (OpenMP, 2 threads)".
// While one is alive on a thread, every sgemm of that thread uses the row-invariant kernel
// (kernels/batch_invariance.h): opened by the dispatchers from Exec::batch_invariant, so that the
// CPU kernels that call sgemm inside (attention, MoE) need no flag of their own.
class RowInvariantScope {
 public:
  explicit RowInvariantScope(bool on);
  ~RowInvariantScope();
  RowInvariantScope(const RowInvariantScope&) = delete;
  RowInvariantScope& operator=(const RowInvariantScope&) = delete;

 private:
  bool previous_;
};

std::string blas_description();
// True when the BLAS runs its own pthreads pool beside OpenMP's (see cmake/dependencies.cmake).
bool blas_uses_own_thread_pool();

}  // namespace loom::cpu
