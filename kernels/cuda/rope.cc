// Host side of CUDA RoPE: checks as in kernels/cpu/rope.cc; positions (step data) and the
// table's inv_freq are already on the device: nothing is uploaded per call.
#include "kernels/cuda/rope.h"

#include "kernels/cuda/device.h"

namespace loom::cuda {

namespace {
void rope_apply(const char* fn, const Exec& ex, const Tensor& x, const Tensor& positions,
                const RopeTable& table, int64_t dim_offset, bool inverse) {
  LOOM_CHECK_CUDA_ARG(fn, x);
  LOOM_CHECK_ACT(x);
  LOOM_CHECK_CUDA_ARG(fn, positions);
  LOOM_CHECK(positions.ndim() == 1 && positions.dtype() == DType::kI64 && positions.is_contiguous(),
             "%s: positions must be contiguous i64 [T], got %s", fn, positions.describe().c_str());
  LOOM_CHECK(x.ndim() == 3 && x.dim(0) == positions.dim(0) && dim_offset >= 0 &&
                 dim_offset + table.rotary_dim <= x.dim(2) && table.rotary_dim % 2 == 0 &&
                 table.inv_freq.dtype() == DType::kF32 && table.inv_freq.is_contiguous() &&
                 table.inv_freq.numel() * 2 == table.rotary_dim,
             "%s: x %s, %zu positions, rotary_dim %d", fn, x.describe().c_str(),
             static_cast<size_t>(positions.dim(0)), table.rotary_dim);
  if (positions.dim(0) == 0 || table.rotary_dim == 0 || x.dim(1) == 0) return;
  LOOM_CHECK_CUDA_ARG(fn, table.inv_freq);
  launch::rope(stream_of(ex), x.raw(), x.dtype() == DType::kBF16, positions.data<int64_t>(),
               table.inv_freq.data<float>(), table.attention_factor, x.dim(0), x.dim(1), x.dim(2),
               table.rotary_dim, dim_offset, table.style == RopeStyle::kInterleaved, inverse);
}
}  // namespace

void rope_forward(const Exec& ex, const Tensor& x, const Tensor& positions, const RopeTable& table,
                  int64_t dim_offset) {
  rope_apply("rope_forward", ex, x, positions, table, dim_offset, /*inverse=*/false);
}

void rope_backward(const Exec& ex, const Tensor& dx, const Tensor& positions,
                   const RopeTable& table, int64_t dim_offset) {
  LOOM_CHECK(dx.dtype() == DType::kF32, "rope_backward: dx %s, expected f32",
             dx.describe().c_str());
  rope_apply("rope_backward", ex, dx, positions, table, dim_offset, /*inverse=*/true);
}

}  // namespace loom::cuda
