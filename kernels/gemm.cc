// Device dispatch for kernels/gemm.h: OpenBLAS (and Loom's row-invariant kernel) on the CPU,
// cuBLAS on CUDA.
#include "kernels/gemm.h"

#include "kernels/cpu/gemm.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/gemm.h"
#endif

namespace loom {

void linear_forward(const Exec& ex, const Tensor& x, const Tensor& w, const Tensor& out,
                    float beta) {
  LOOM_ON_EXEC_DEVICE(ex, "linear_forward", x, w, out);
  if (ex.device.is_cpu()) {
    const cpu::RowInvariantScope numerics(ex.batch_invariant);
    return cpu::linear_forward(x, w, out, beta);
  }
#ifdef LOOM_WITH_CUDA
  // cuBLAS picks its algorithm (and split-K) by shape: no batch-invariant GEMM on CUDA yet.
  LOOM_CHECK(!ex.batch_invariant, "linear_forward: batch-invariant mode is CPU-only for now");
  return cuda::linear_forward(ex, x, w, out, beta);
#else
  no_kernel_for(ex, "linear_forward");
#endif
}

void matmul(const Exec& ex, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
            const Tensor& out, float alpha, float beta) {
  LOOM_ON_EXEC_DEVICE(ex, "matmul", a, b, out);
  if (ex.device.is_cpu()) {
    const cpu::RowInvariantScope numerics(ex.batch_invariant);
    return cpu::matmul(a, trans_a, b, trans_b, out, alpha, beta);
  }
#ifdef LOOM_WITH_CUDA
  // cuBLAS picks its algorithm (and split-K) by shape: no batch-invariant GEMM on CUDA yet.
  LOOM_CHECK(!ex.batch_invariant, "matmul: batch-invariant mode is CPU-only for now");
  return cuda::matmul(ex, a, trans_a, b, trans_b, out, alpha, beta);
#else
  no_kernel_for(ex, "matmul");
#endif
}

}  // namespace loom
