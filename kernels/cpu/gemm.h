// CPU implementations of kernels/gemm.h (same contracts), on OpenBLAS.
#pragma once

#include <string>

#include "core/tensor.h"

namespace loom::cpu {

void linear_forward(const Tensor& x, const Tensor& w, const Tensor& out, float beta);
void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& out,
            float alpha, float beta);

// Raw row-major sgemm: c[m, n] = alpha * op(a) @ op(b) + beta * c with leading dimensions.
// Handles m, n or k = 0 (k = 0 scales c by beta; beta = 0 writes zeros, never reading c).
// Must not be called from inside an OpenMP parallel region (OpenBLAS threads itself).
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

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
