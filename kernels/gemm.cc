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
  LOOM_CHECK_F32(x);
  LOOM_CHECK_F32(out);
  LOOM_CHECK((w.dtype() == DType::kF32 || w.dtype() == DType::kBF16) && w.is_contiguous(),
             "linear_forward: w must be contiguous f32 or bf16, got %s", w.describe().c_str());
  LOOM_CHECK(w.ndim() == 2 && x.ndim() >= 1 && out.ndim() == x.ndim(),
             "linear_forward: x %s w %s out %s", x.describe().c_str(), w.describe().c_str(),
             out.describe().c_str());
  LOOM_CHECK(x.dim(-1) == w.dim(1) && out.dim(-1) == w.dim(0), "linear_forward: x %s w %s out %s",
             x.describe().c_str(), w.describe().c_str(), out.describe().c_str());
  for (int i = 0; i + 1 < x.ndim(); ++i) {
    LOOM_CHECK(x.dim(i) == out.dim(i), "linear_forward: x %s vs out %s", x.describe().c_str(),
               out.describe().c_str());
  }
  if (ex.device.is_cpu()) {
    const cpu::RowInvariantScope numerics(ex.batch_invariant);
    return cpu::linear_forward(x, w, out, beta);
  }
#ifdef LOOM_WITH_CUDA
  // cuBLAS picks its algorithm (and split-K) by shape: no batch-invariant GEMM on CUDA yet.
  LOOM_CHECK(!ex.batch_invariant, "linear_forward: batch-invariant mode is CPU-only for now");
  // cuBLAS has no GEMM of bf16 weights with f32 activations; the CUDA bf16 path (bf16
  // activations, cuBLASLt) comes with issue 13.
  LOOM_CHECK(w.dtype() == DType::kF32,
             "linear_forward: no %s kernel for %s weights with f32 activations yet (issue 13)",
             device_name(ex.device).c_str(), std::string(dtype_name(w.dtype())).c_str());
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
