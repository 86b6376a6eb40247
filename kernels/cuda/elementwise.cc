// Host side of the CUDA elementwise kernels: checks as in kernels/cpu/elementwise.cc (with bf16
// allowed for every activation and in-place writes only over the same dtype), then the launch.
#include "kernels/cuda/elementwise.h"

#include "kernels/cuda/device.h"

namespace loom::cuda {

namespace {
bool is_bf16(const Tensor& t) { return t.dtype() == DType::kBF16; }

// x op= f(gate) elementwise: both on the GPU, f32 or bf16 each, same numel.
void check_gated(const char* fn, const Tensor& x, const Tensor& gate) {
  LOOM_CHECK_CUDA_ARG(fn, x);
  LOOM_CHECK_CUDA_ARG(fn, gate);
  LOOM_CHECK_ACT(x);
  LOOM_CHECK_ACT(gate);
  LOOM_CHECK(x.numel() == gate.numel(), "%s %s by %s", fn, x.describe().c_str(),
             gate.describe().c_str());
  LOOM_CHECK_ALIAS_SAME_TYPE(fn, x, gate);
}

// src [N, C] and dst [N, c] (or the reverse for scatter): the column copies' checks.
void check_columns(const char* fn, const Tensor& src, const Tensor& dst, int64_t col_begin,
                   int64_t width, int64_t wide_cols) {
  LOOM_CHECK_CUDA_ARG(fn, src);
  LOOM_CHECK_CUDA_ARG(fn, dst);
  LOOM_CHECK_ACT(src);
  LOOM_CHECK_ACT(dst);
  LOOM_CHECK(src.ndim() == 2 && dst.ndim() == 2 && src.dim(0) == dst.dim(0) && col_begin >= 0 &&
                 col_begin + width <= wide_cols,
             "%s from %s at %lld into %s", fn, src.describe().c_str(),
             static_cast<long long>(col_begin), dst.describe().c_str());
  LOOM_CHECK_ALIAS_SAME_TYPE(fn, dst, src);
}
}  // namespace

void add_inplace(const Exec& ex, const Tensor& dst, const Tensor& src) {
  LOOM_CHECK_CUDA_ARG("add_inplace", dst);
  LOOM_CHECK_CUDA_ARG("add_inplace", src);
  LOOM_CHECK_ACT(dst);
  LOOM_CHECK_ACT(src);
  LOOM_CHECK(dst.shape() == src.shape(), "add_inplace %s += %s", dst.describe().c_str(),
             src.describe().c_str());
  LOOM_CHECK_ALIAS_SAME_TYPE("add_inplace", dst, src);
  launch::pointwise(stream_of(ex), launch::Unary::kAdd, dst.raw(), is_bf16(dst), src.raw(),
                    is_bf16(src), nullptr, false, dst.numel());
}

void add_bias(const Exec& ex, const Tensor& x, const Tensor& bias) {
  LOOM_CHECK_CUDA_ARG("add_bias", x);
  LOOM_CHECK_CUDA_ARG("add_bias", bias);
  LOOM_CHECK_ACT(x);
  LOOM_CHECK_F32(bias);
  LOOM_CHECK(x.ndim() == 2 && bias.numel() == x.dim(1), "add_bias %s + %s", x.describe().c_str(),
             bias.describe().c_str());
  launch::add_bias(stream_of(ex), x.raw(), is_bf16(x), bias.data<float>(), x.dim(0), x.dim(1));
}

void mul_sigmoid_inplace(const Exec& ex, const Tensor& x, const Tensor& gate) {
  check_gated("mul_sigmoid_inplace", x, gate);
  launch::pointwise(stream_of(ex), launch::Unary::kMulSigmoid, x.raw(), is_bf16(x), gate.raw(),
                    is_bf16(gate), nullptr, false, x.numel());
}

void mul_sigmoid_rows(const Exec& ex, const Tensor& x, const Tensor& gate) {
  LOOM_CHECK_CUDA_ARG("mul_sigmoid_rows", x);
  LOOM_CHECK_CUDA_ARG("mul_sigmoid_rows", gate);
  LOOM_CHECK_ACT(x);
  LOOM_CHECK_ACT(gate);
  LOOM_CHECK(x.ndim() == 2 && gate.numel() == x.dim(0), "mul_sigmoid_rows %s by %s",
             x.describe().c_str(), gate.describe().c_str());
  LOOM_CHECK_ALIAS_SAME_TYPE("mul_sigmoid_rows", x, gate);
  launch::mul_sigmoid_rows(stream_of(ex), x.raw(), is_bf16(x), gate.raw(), is_bf16(gate), x.dim(0),
                           x.dim(1));
}

void mul_silu_inplace(const Exec& ex, const Tensor& x, const Tensor& gate) {
  check_gated("mul_silu_inplace", x, gate);
  launch::pointwise(stream_of(ex), launch::Unary::kMulSilu, x.raw(), is_bf16(x), gate.raw(),
                    is_bf16(gate), nullptr, false, x.numel());
}

void sigmoid_inplace(const Exec& ex, const Tensor& x) {
  LOOM_CHECK_CUDA_ARG("sigmoid_inplace", x);
  LOOM_CHECK_ACT(x);
  launch::pointwise(stream_of(ex), launch::Unary::kSigmoid, x.raw(), is_bf16(x), nullptr, false,
                    nullptr, false, x.numel());
}

void copy_columns(const Exec& ex, const Tensor& src, int64_t col_begin, const Tensor& dst) {
  check_columns("copy_columns", src, dst, col_begin, dst.ndim() == 2 ? dst.dim(1) : 0,
                src.ndim() == 2 ? src.dim(1) : 0);
  const size_t src_elem = dtype_size(src.dtype());
  launch::copy_2d(stream_of(ex), dst.raw(), is_bf16(dst), dst.dim(1),
                  static_cast<const char*>(src.raw()) + col_begin * src_elem, is_bf16(src),
                  src.dim(1), src.dim(0), dst.dim(1));
}

void scatter_columns(const Exec& ex, const Tensor& src, int64_t col_begin, const Tensor& dst) {
  check_columns("scatter_columns", src, dst, col_begin, src.ndim() == 2 ? src.dim(1) : 0,
                dst.ndim() == 2 ? dst.dim(1) : 0);
  const size_t dst_elem = dtype_size(dst.dtype());
  launch::copy_2d(stream_of(ex), static_cast<char*>(dst.raw()) + col_begin * dst_elem, is_bf16(dst),
                  dst.dim(1), src.raw(), is_bf16(src), src.dim(1), src.dim(0), src.dim(1));
}

void gather_rows(const Exec& ex, const Tensor& src, const Tensor& rows, const Tensor& dst) {
  LOOM_CHECK_CUDA_ARG("gather_rows", src);
  LOOM_CHECK_CUDA_ARG("gather_rows", rows);
  LOOM_CHECK_CUDA_ARG("gather_rows", dst);
  LOOM_CHECK_ACT(src);
  LOOM_CHECK_ACT(dst);
  LOOM_CHECK(rows.ndim() == 1 && rows.dtype() == DType::kI64 && rows.is_contiguous(),
             "gather_rows: rows must be contiguous i64 [n], got %s", rows.describe().c_str());
  LOOM_CHECK(
      src.ndim() == 2 && dst.ndim() == 2 && src.dim(1) == dst.dim(1) && dst.dim(0) == rows.dim(0),
      "gather_rows of %s from %s into %s", rows.describe().c_str(), src.describe().c_str(),
      dst.describe().c_str());
  LOOM_CHECK_ALIAS_SAME_TYPE("gather_rows", dst, src);
  if (rows.dim(0) == 0) return;
  launch::gather_rows_i64(stream_of(ex), rows.data<int64_t>(), src.raw(), is_bf16(src), dst.raw(),
                          is_bf16(dst), rows.dim(0), src.dim(0), src.dim(1), nullptr);
}

void zero_fill(const Exec& ex, const Tensor& t) {
  LOOM_CHECK_CUDA_ARG("zero_fill", t);
  LOOM_CUDA_CHECK(cudaMemsetAsync(t.raw(), 0, t.nbytes(), stream_of(ex)));
}

}  // namespace loom::cuda
