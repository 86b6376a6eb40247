// Host side of the CUDA elementwise kernels: checks as in kernels/cpu/elementwise.cc, then launch.
#include "kernels/cuda/elementwise.h"

#include "kernels/cuda/device.h"

namespace loom::cuda {

void add_inplace(const Exec& ex, const Tensor& dst, const Tensor& src) {
  LOOM_CHECK_CUDA_ARG("add_inplace", dst);
  LOOM_CHECK_CUDA_ARG("add_inplace", src);
  LOOM_CHECK_F32(dst);
  LOOM_CHECK_F32(src);
  LOOM_CHECK(dst.shape() == src.shape(), "add_inplace %s += %s", dst.describe().c_str(),
             src.describe().c_str());
  launch::pointwise(stream_of(ex), launch::Unary::kAdd, dst.data<float>(), src.data<float>(),
                    nullptr, dst.numel());
}

void add_bias(const Exec& ex, const Tensor& x, const Tensor& bias) {
  LOOM_CHECK_CUDA_ARG("add_bias", x);
  LOOM_CHECK_CUDA_ARG("add_bias", bias);
  LOOM_CHECK_F32(x);
  LOOM_CHECK_F32(bias);
  LOOM_CHECK(x.ndim() == 2 && bias.numel() == x.dim(1), "add_bias %s + %s", x.describe().c_str(),
             bias.describe().c_str());
  launch::add_bias(stream_of(ex), x.data<float>(), bias.data<float>(), x.dim(0), x.dim(1));
}

void mul_sigmoid_inplace(const Exec& ex, const Tensor& x, const Tensor& gate) {
  LOOM_CHECK_CUDA_ARG("mul_sigmoid_inplace", x);
  LOOM_CHECK_CUDA_ARG("mul_sigmoid_inplace", gate);
  LOOM_CHECK_F32(x);
  LOOM_CHECK_F32(gate);
  LOOM_CHECK(x.numel() == gate.numel(), "mul_sigmoid_inplace %s by %s", x.describe().c_str(),
             gate.describe().c_str());
  launch::pointwise(stream_of(ex), launch::Unary::kMulSigmoid, x.data<float>(), gate.data<float>(),
                    nullptr, x.numel());
}

void mul_sigmoid_rows(const Exec& ex, const Tensor& x, const Tensor& gate) {
  LOOM_CHECK_CUDA_ARG("mul_sigmoid_rows", x);
  LOOM_CHECK_CUDA_ARG("mul_sigmoid_rows", gate);
  LOOM_CHECK_F32(x);
  LOOM_CHECK_F32(gate);
  LOOM_CHECK(x.ndim() == 2 && gate.numel() == x.dim(0), "mul_sigmoid_rows %s by %s",
             x.describe().c_str(), gate.describe().c_str());
  launch::mul_sigmoid_rows(stream_of(ex), x.data<float>(), gate.data<float>(), x.dim(0), x.dim(1));
}

void mul_silu_inplace(const Exec& ex, const Tensor& x, const Tensor& gate) {
  LOOM_CHECK_CUDA_ARG("mul_silu_inplace", x);
  LOOM_CHECK_CUDA_ARG("mul_silu_inplace", gate);
  LOOM_CHECK_F32(x);
  LOOM_CHECK_F32(gate);
  LOOM_CHECK(x.numel() == gate.numel(), "mul_silu_inplace %s by %s", x.describe().c_str(),
             gate.describe().c_str());
  launch::pointwise(stream_of(ex), launch::Unary::kMulSilu, x.data<float>(), gate.data<float>(),
                    nullptr, x.numel());
}

void sigmoid_inplace(const Exec& ex, const Tensor& x) {
  LOOM_CHECK_CUDA_ARG("sigmoid_inplace", x);
  LOOM_CHECK_F32(x);
  launch::pointwise(stream_of(ex), launch::Unary::kSigmoid, x.data<float>(), nullptr, nullptr,
                    x.numel());
}

void copy_columns(const Exec& ex, const Tensor& src, int64_t col_begin, const Tensor& dst) {
  LOOM_CHECK_CUDA_ARG("copy_columns", src);
  LOOM_CHECK_CUDA_ARG("copy_columns", dst);
  LOOM_CHECK_F32(src);
  LOOM_CHECK_F32(dst);
  LOOM_CHECK(src.ndim() == 2 && dst.ndim() == 2 && src.dim(0) == dst.dim(0) && col_begin >= 0 &&
                 col_begin + dst.dim(1) <= src.dim(1),
             "copy_columns from %s at %lld into %s", src.describe().c_str(),
             static_cast<long long>(col_begin), dst.describe().c_str());
  launch::copy_2d(stream_of(ex), dst.data<float>(), dst.dim(1), src.data<float>() + col_begin,
                  src.dim(1), src.dim(0), dst.dim(1));
}

void scatter_columns(const Exec& ex, const Tensor& src, int64_t col_begin, const Tensor& dst) {
  LOOM_CHECK_CUDA_ARG("scatter_columns", src);
  LOOM_CHECK_CUDA_ARG("scatter_columns", dst);
  LOOM_CHECK_F32(src);
  LOOM_CHECK_F32(dst);
  LOOM_CHECK(src.ndim() == 2 && dst.ndim() == 2 && src.dim(0) == dst.dim(0) && col_begin >= 0 &&
                 col_begin + src.dim(1) <= dst.dim(1),
             "scatter_columns of %s at %lld into %s", src.describe().c_str(),
             static_cast<long long>(col_begin), dst.describe().c_str());
  launch::copy_2d(stream_of(ex), dst.data<float>() + col_begin, dst.dim(1), src.data<float>(),
                  src.dim(1), src.dim(0), src.dim(1));
}

void gather_rows(const Exec& ex, const Tensor& src, const Tensor& rows, const Tensor& dst) {
  LOOM_CHECK_CUDA_ARG("gather_rows", src);
  LOOM_CHECK_CUDA_ARG("gather_rows", rows);
  LOOM_CHECK_CUDA_ARG("gather_rows", dst);
  LOOM_CHECK_F32(src);
  LOOM_CHECK_F32(dst);
  LOOM_CHECK(rows.ndim() == 1 && rows.dtype() == DType::kI64 && rows.is_contiguous(),
             "gather_rows: rows must be contiguous i64 [n], got %s", rows.describe().c_str());
  LOOM_CHECK(
      src.ndim() == 2 && dst.ndim() == 2 && src.dim(1) == dst.dim(1) && dst.dim(0) == rows.dim(0),
      "gather_rows of %s from %s into %s", rows.describe().c_str(), src.describe().c_str(),
      dst.describe().c_str());
  if (rows.dim(0) == 0) return;
  launch::gather_rows_i64(stream_of(ex), rows.data<int64_t>(), src.data<float>(), dst.data<float>(),
                          rows.dim(0), src.dim(0), src.dim(1), nullptr);
}

}  // namespace loom::cuda
