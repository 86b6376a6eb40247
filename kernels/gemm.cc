// Device dispatch for kernels/gemm.h: OpenBLAS (and Loom's row-invariant kernel) on the CPU,
// cuBLAS on CUDA.
#include "kernels/gemm.h"

#include "kernels/batch_invariance.h"
#include "kernels/cpu/gemm.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/gemm.h"
#endif

namespace loom {

void linear_forward(const Tensor& x, const Tensor& w, const Tensor& out, float beta) {
#ifdef LOOM_WITH_CUDA
  LOOM_CHECK_SAME_DEVICE("linear_forward", x, w, out);
#endif
  if (x.device() == Device::kCpu) return cpu::linear_forward(x, w, out, beta);
#ifdef LOOM_WITH_CUDA
  // cuBLAS picks its algorithm (and split-K) by shape: no batch-invariant GEMM on CUDA yet.
  LOOM_CHECK(!batch_invariant_numerics(),
             "linear_forward: batch-invariant mode is CPU-only for now");
  return cuda::linear_forward(x, w, out, beta);
#else
  LOOM_CHECK(false, "linear_forward: %s tensor in a build without CUDA", x.describe().c_str());
#endif
}

void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& out,
            float alpha, float beta) {
#ifdef LOOM_WITH_CUDA
  LOOM_CHECK_SAME_DEVICE("matmul", a, b, out);
#endif
  if (a.device() == Device::kCpu) return cpu::matmul(a, trans_a, b, trans_b, out, alpha, beta);
#ifdef LOOM_WITH_CUDA
  // cuBLAS picks its algorithm (and split-K) by shape: no batch-invariant GEMM on CUDA yet.
  LOOM_CHECK(!batch_invariant_numerics(), "matmul: batch-invariant mode is CPU-only for now");
  return cuda::matmul(a, trans_a, b, trans_b, out, alpha, beta);
#else
  LOOM_CHECK(false, "matmul: %s tensor in a build without CUDA", a.describe().c_str());
#endif
}

}  // namespace loom
