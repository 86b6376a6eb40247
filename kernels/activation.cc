// Device dispatch for kernels/activation.h: CPU kernels, and their CUDA twins in builds with CUDA.
#include "kernels/activation.h"

#include "kernels/cpu/activation.h"
#include "kernels/cpu/elementwise.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/activation.h"
#include "kernels/cuda/backward.h"
#endif

namespace loom {

void silu_mul_forward(const Exec& ex, const Tensor& gate, const Tensor& up, const Tensor& out) {
  LOOM_ON_EXEC_DEVICE(ex, "silu_mul_forward", gate, up, out);
  if (ex.device.is_cpu()) return cpu::silu_mul_forward(gate, up, out);
#ifdef LOOM_WITH_CUDA
  return cuda::silu_mul_forward(ex, gate, up, out);
#else
  no_kernel_for(ex, "silu_mul_forward");
#endif
}

void embedding_forward(const Exec& ex, const Tensor& ids, const Tensor& table, const Tensor& out,
                       EmbeddingIds ids_state) {
  LOOM_ON_EXEC_DEVICE(ex, "embedding_forward", table, out);
  // The host checks as it reads: a checked id costs nothing there.
  if (ex.device.is_cpu()) return cpu::embedding_forward(ids, table, out);
#ifdef LOOM_WITH_CUDA
  return cuda::embedding_forward(ex, ids, table, out, ids_state == EmbeddingIds::kChecked);
#else
  no_kernel_for(ex, "embedding_forward");
#endif
}

void silu_mul_backward(const Exec& ex, const Tensor& gate, const Tensor& up, const Tensor& dout,
                       const Tensor& dgate, const Tensor& dup) {
  LOOM_ON_EXEC_DEVICE(ex, "silu_mul_backward", gate, up, dout, dgate, dup);
  for (const Tensor* t : {&gate, &up, &dout, &dgate, &dup}) {
    LOOM_CHECK_F32(*t);
    LOOM_CHECK(t->shape() == gate.shape(), "silu_mul_backward: gate %s vs %s",
               gate.describe().c_str(), t->describe().c_str());
  }
  LOOM_CHECK(dgate.raw() != dup.raw() || gate.numel() == 0, "silu_mul_backward: dgate aliases dup");
  if (ex.device.is_cpu()) return cpu::silu_mul_backward(gate, up, dout, dgate, dup);
#ifdef LOOM_WITH_CUDA
  return cuda::silu_mul_backward(ex, gate, up, dout, dgate, dup);
#else
  no_kernel_for(ex, "silu_mul_backward");
#endif
}

void embedding_backward(const Exec& ex, const Tensor& ids, const Tensor& dout,
                        const Tensor& dtable) {
  LOOM_ON_EXEC_DEVICE(ex, "embedding_backward", dout, dtable);
  // ids may live on the host or on ex.device, as for embedding_forward; the CPU reads them here.
  if (ex.device.is_cpu()) LOOM_ON_EXEC_DEVICE(ex, "embedding_backward", ids);
  LOOM_CHECK(ids.ndim() == 1 && ids.is_contiguous() &&
                 (ids.dtype() == DType::kI32 || ids.dtype() == DType::kI64),
             "embedding_backward: ids must be contiguous i32/i64 [T], got %s",
             ids.describe().c_str());
  LOOM_CHECK_F32(dout);
  LOOM_CHECK_F32(dtable);
  LOOM_CHECK(dtable.ndim() == 2 && dout.ndim() == 2 && dout.dim(0) == ids.dim(0) &&
                 dout.dim(1) == dtable.dim(1),
             "embedding_backward: ids %s dout %s dtable %s", ids.describe().c_str(),
             dout.describe().c_str(), dtable.describe().c_str());
  if (ex.device.is_cpu()) return cpu::scatter_add_rows("embedding_backward", dout, ids, dtable);
#ifdef LOOM_WITH_CUDA
  return cuda::scatter_add_rows(ex, "embedding_backward", dout, ids, dtable);
#else
  no_kernel_for(ex, "embedding_backward");
#endif
}

}  // namespace loom
