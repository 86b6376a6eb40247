// Host side of CUDA silu_mul and the embedding lookup (activations f32 or bf16 each).
#include "kernels/cuda/activation.h"

#include <limits>

#include "kernels/cuda/device.h"

namespace loom::cuda {

void silu_mul_forward(const Exec& ex, const Tensor& gate, const Tensor& up, const Tensor& out) {
  LOOM_CHECK_CUDA_ARG("silu_mul_forward", gate);
  LOOM_CHECK_CUDA_ARG("silu_mul_forward", up);
  LOOM_CHECK_CUDA_ARG("silu_mul_forward", out);
  LOOM_CHECK_ACT(gate);
  LOOM_CHECK_ACT(up);
  LOOM_CHECK_ACT(out);
  LOOM_CHECK(up.shape() == gate.shape() && out.shape() == gate.shape(),
             "silu_mul_forward: gate %s up %s out %s", gate.describe().c_str(),
             up.describe().c_str(), out.describe().c_str());
  LOOM_CHECK_ALIAS_SAME_TYPE("silu_mul_forward", out, gate);
  LOOM_CHECK_ALIAS_SAME_TYPE("silu_mul_forward", out, up);
  launch::pointwise(stream_of(ex), launch::Unary::kSiluMul, gate.raw(),
                    gate.dtype() == DType::kBF16, up.raw(), up.dtype() == DType::kBF16, out.raw(),
                    out.dtype() == DType::kBF16, gate.numel());
}

namespace {
template <typename Id>
void check_host_ids(const Id* ids, int64_t t, int64_t v) {
  for (int64_t i = 0; i < t; ++i) {
    const int64_t id = static_cast<int64_t>(ids[i]);
    LOOM_CHECK(id >= 0 && id < v, "embedding_forward: ids[%d] = %d outside [0, %d)", i, id, v);
  }
}
}  // namespace

void embedding_forward(const Exec& ex, const Tensor& ids, const Tensor& table, const Tensor& out,
                       bool ids_checked) {
  LOOM_CHECK_CUDA_ARG("embedding_forward", table);
  LOOM_CHECK_CUDA_ARG("embedding_forward", out);
  LOOM_CHECK(ids.ndim() == 1 && ids.is_contiguous() &&
                 (ids.dtype() == DType::kI32 || ids.dtype() == DType::kI64),
             "embedding_forward: ids must be contiguous i32/i64 [T], got %s",
             ids.describe().c_str());
  LOOM_CHECK_ACT(table);
  LOOM_CHECK_ACT(out);
  LOOM_CHECK(table.ndim() == 2, "embedding_forward: table %s", table.describe().c_str());
  const int64_t t = ids.dim(0), v = table.dim(0), d = table.dim(1);
  LOOM_CHECK_SHAPE(out, t, d);
  LOOM_CHECK(t <= std::numeric_limits<int32_t>::max(), "embedding_forward: %lld ids",
             static_cast<long long>(t));
  if (t == 0) return;
  const bool i32 = ids.dtype() == DType::kI32;
  const bool table_bf16 = table.dtype() == DType::kBF16, out_bf16 = out.dtype() == DType::kBF16;
  const size_t id_bytes = ids.nbytes();
  if (ids.device() == Device::kCpu) {
    // Checked on the host before anything is launched.
    if (i32) {
      check_host_ids(ids.data<int32_t>(), t, v);
    } else {
      check_host_ids(ids.data<int64_t>(), t, v);
    }
    Scratch dev_ids(id_bytes, stream_of(ex));
    dev_ids.upload(ids.raw(), id_bytes);
    if (i32) {
      launch::gather_rows_i32(stream_of(ex), static_cast<const int32_t*>(dev_ids.get()),
                              table.raw(), table_bf16, out.raw(), out_bf16, t, v, d, nullptr);
    } else {
      launch::gather_rows_i64(stream_of(ex), static_cast<const int64_t*>(dev_ids.get()),
                              table.raw(), table_bf16, out.raw(), out_bf16, t, v, d, nullptr);
    }
    return;
  }
  if (ids_checked) {
    // Validated by the caller: an id out of range would still read a zero row.
    if (i32) {
      launch::gather_rows_i32(stream_of(ex), ids.data<int32_t>(), table.raw(), table_bf16,
                              out.raw(), out_bf16, t, v, d, nullptr);
    } else {
      launch::gather_rows_i64(stream_of(ex), ids.data<int64_t>(), table.raw(), table_bf16,
                              out.raw(), out_bf16, t, v, d, nullptr);
    }
    return;
  }
  // Device ids: clamp (a zero row) and flag in the kernel, then report on the host.
  Scratch flag(sizeof(int32_t), stream_of(ex));
  const int32_t none = std::numeric_limits<int32_t>::max();
  flag.upload(&none, sizeof(none));
  if (i32) {
    launch::gather_rows_i32(stream_of(ex), ids.data<int32_t>(), table.raw(), table_bf16, out.raw(),
                            out_bf16, t, v, d, static_cast<int32_t*>(flag.get()));
  } else {
    launch::gather_rows_i64(stream_of(ex), ids.data<int64_t>(), table.raw(), table_bf16, out.raw(),
                            out_bf16, t, v, d, static_cast<int32_t*>(flag.get()));
  }
  int32_t first_bad = none;
  LOOM_CUDA_CHECK(cudaMemcpyAsync(&first_bad, flag.get(), sizeof(first_bad), cudaMemcpyDeviceToHost,
                                  stream_of(ex)));
  synchronize(ex.device);
  if (first_bad != none) {
    int64_t bad_id = 0;
    const char* src = static_cast<const char*>(ids.raw()) + first_bad * dtype_size(ids.dtype());
    if (i32) {
      int32_t b = 0;
      LOOM_CUDA_CHECK(cudaMemcpy(&b, src, sizeof(b), cudaMemcpyDeviceToHost));
      bad_id = b;
    } else {
      LOOM_CUDA_CHECK(cudaMemcpy(&bad_id, src, sizeof(bad_id), cudaMemcpyDeviceToHost));
    }
    LOOM_CHECK(false, "embedding_forward: ids[%d] = %d outside [0, %d) (row written as zeros)",
               first_bad, bad_id, v);
  }
}

}  // namespace loom::cuda
