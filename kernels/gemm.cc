// Device dispatch for kernels/gemm.h: OpenBLAS (and Loom's row-invariant kernel) on the CPU,
// cuBLAS, cuBLASLt and Loom's kernels on CUDA (kernels/cuda/gemm.h says which runs when).
#include "kernels/gemm.h"

#include <optional>

#include "core/workspace.h"
#include "kernels/activation.h"
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
  // f32 x and out with f32, bf16 or FP8 w; bf16 x or out (bf16 activations) with bf16 or FP8 w,
  // and bf16 x with f32 w into f32 out (a router's f32 logits from bf16 rows). Under
  // ex.batch_invariant the CUDA twin runs Loom's row-invariant kernels instead of cuBLAS.
  const bool bf16_activations = x.dtype() == DType::kBF16 || out.dtype() == DType::kBF16;
  if (!bf16_activations || w.dtype() == DType::kF32) LOOM_CHECK_F32(out);
  if (!bf16_activations) LOOM_CHECK_F32(x);
  return cuda::linear_forward(ex, x, w, out, beta);
#else
  no_kernel_for(ex, "linear_forward");
#endif
}

void linear_swiglu_forward(const Exec& ex, const Tensor& x, const Tensor& w_gate,
                           const Tensor& w_up, const Tensor& h) {
  LOOM_ON_EXEC_DEVICE(ex, "linear_swiglu_forward", x, w_gate, w_up, h);
  LOOM_CHECK(w_gate.shape() == w_up.shape() && w_gate.dtype() == w_up.dtype(),
             "linear_swiglu_forward: w_gate %s w_up %s", w_gate.describe().c_str(),
             w_up.describe().c_str());
#ifdef LOOM_WITH_CUDA
  if (ex.device.is_cuda() && cuda::linear_swiglu_gemv(ex, x, w_gate, w_up, h)) return;
#endif
  // The gate's product goes to h itself, silu_mul then works in place: one scratch tensor.
  std::optional<Workspace::Mark> mark;
  if (ex.workspace != nullptr) mark.emplace(*ex.workspace);
  const Tensor u = ex.workspace != nullptr ? ex.workspace->take(h.shape(), h.dtype())
                                           : Tensor::empty(h.shape(), h.dtype(), ex.device);
  linear_forward(ex, x, w_gate, h);
  linear_forward(ex, x, w_up, u);
  silu_mul_forward(ex, h, u, h);
}

bool linear_swiglu_is_gemv(const Exec& ex, const Tensor& x, const Tensor& w_gate,
                           const Tensor& w_up, const Tensor& h) {
#ifdef LOOM_WITH_CUDA
  return ex.device.is_cuda() && cuda::linear_swiglu_gemv_applies(ex, x, w_gate, w_up, h);
#else
  (void)ex;
  (void)x;
  (void)w_gate;
  (void)w_up;
  (void)h;
  return false;
#endif
}

bool linear_is_gemv(const Exec& ex, const Tensor& w, int64_t rows) {
#ifdef LOOM_WITH_CUDA
  return ex.device.is_cuda() && !ex.batch_invariant && w.dtype() == DType::kBF16 && w.ndim() == 2 &&
         w.is_contiguous() && rows >= 1 && rows <= cuda::kGemvAutoRows;
#else
  (void)ex;
  (void)w;
  (void)rows;
  return false;
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
