// Device dispatch for kernels/gemm.h: OpenBLAS (and Loom's row-invariant kernel) on the CPU,
// cuBLAS, cuBLASLt and Loom's kernels on CUDA (kernels/cuda/gemm.h says which runs when).
#include "kernels/gemm.h"

#include "kernels/cpu/gemm.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/gemm.h"
#endif

namespace loom {

void linear_forward(const Exec& ex, const Tensor& x, const Tensor& w, const Tensor& out,
                    float beta) {
  LOOM_ON_EXEC_DEVICE(ex, "linear_forward", x, w, out);
  LOOM_CHECK(
      (w.dtype() == DType::kF32 || w.dtype() == DType::kBF16 || w.dtype() == DType::kF8E4M3) &&
          w.is_contiguous(),
      "linear_forward: w must be contiguous f32, bf16 or fp8, got %s", w.describe().c_str());
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
    LOOM_CHECK_F32(x);
    LOOM_CHECK_F32(out);
    const cpu::RowInvariantScope numerics(ex.batch_invariant);
    return cpu::linear_forward(x, w, out, beta);
  }
#ifdef LOOM_WITH_CUDA
  // f32 x and out with f32, bf16 or FP8 w; bf16 x or out (bf16 activations) with bf16 or FP8 w
  // only. Under ex.batch_invariant the CUDA twin runs Loom's row-invariant kernels instead of
  // cuBLAS.
  const bool bf16_activations = x.dtype() == DType::kBF16 || out.dtype() == DType::kBF16;
  if (!bf16_activations || w.dtype() == DType::kF32) {
    LOOM_CHECK_F32(x);
    LOOM_CHECK_F32(out);
  }
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
  // Under ex.batch_invariant the CUDA twin runs Loom's row-invariant kernel instead of cuBLAS.
  return cuda::matmul(ex, a, trans_a, b, trans_b, out, alpha, beta);
#else
  no_kernel_for(ex, "matmul");
#endif
}

}  // namespace loom
