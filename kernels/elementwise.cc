// Device dispatch for kernels/elementwise.h.
#include "kernels/elementwise.h"

#include "kernels/cpu/elementwise.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/elementwise.h"
#endif

namespace loom {

void add_inplace(const Tensor& dst, const Tensor& src) {
#ifdef LOOM_WITH_CUDA
  LOOM_CHECK_SAME_DEVICE("add_inplace", dst, src);
#endif
  if (dst.device() == Device::kCpu) return cpu::add_inplace(dst, src);
#ifdef LOOM_WITH_CUDA
  return cuda::add_inplace(dst, src);
#else
  LOOM_CHECK(false, "add_inplace: %s tensor in a build without CUDA", dst.describe().c_str());
#endif
}

void add_bias(const Tensor& x, const Tensor& bias) {
#ifdef LOOM_WITH_CUDA
  LOOM_CHECK_SAME_DEVICE("add_bias", x, bias);
#endif
  if (x.device() == Device::kCpu) return cpu::add_bias(x, bias);
#ifdef LOOM_WITH_CUDA
  return cuda::add_bias(x, bias);
#else
  LOOM_CHECK(false, "add_bias: %s tensor in a build without CUDA", x.describe().c_str());
#endif
}

void mul_sigmoid_inplace(const Tensor& x, const Tensor& gate) {
#ifdef LOOM_WITH_CUDA
  LOOM_CHECK_SAME_DEVICE("mul_sigmoid_inplace", x, gate);
#endif
  if (x.device() == Device::kCpu) return cpu::mul_sigmoid_inplace(x, gate);
#ifdef LOOM_WITH_CUDA
  return cuda::mul_sigmoid_inplace(x, gate);
#else
  LOOM_CHECK(false, "mul_sigmoid_inplace: %s tensor in a build without CUDA", x.describe().c_str());
#endif
}

void mul_sigmoid_rows(const Tensor& x, const Tensor& gate) {
#ifdef LOOM_WITH_CUDA
  LOOM_CHECK_SAME_DEVICE("mul_sigmoid_rows", x, gate);
#endif
  if (x.device() == Device::kCpu) return cpu::mul_sigmoid_rows(x, gate);
#ifdef LOOM_WITH_CUDA
  return cuda::mul_sigmoid_rows(x, gate);
#else
  LOOM_CHECK(false, "mul_sigmoid_rows: %s tensor in a build without CUDA", x.describe().c_str());
#endif
}

void mul_silu_inplace(const Tensor& x, const Tensor& gate) {
#ifdef LOOM_WITH_CUDA
  LOOM_CHECK_SAME_DEVICE("mul_silu_inplace", x, gate);
#endif
  if (x.device() == Device::kCpu) return cpu::mul_silu_inplace(x, gate);
#ifdef LOOM_WITH_CUDA
  return cuda::mul_silu_inplace(x, gate);
#else
  LOOM_CHECK(false, "mul_silu_inplace: %s tensor in a build without CUDA", x.describe().c_str());
#endif
}

void sigmoid_inplace(const Tensor& x) {
  if (x.device() == Device::kCpu) return cpu::sigmoid_inplace(x);
#ifdef LOOM_WITH_CUDA
  return cuda::sigmoid_inplace(x);
#else
  LOOM_CHECK(false, "sigmoid_inplace: %s tensor in a build without CUDA", x.describe().c_str());
#endif
}

void copy_columns(const Tensor& src, int64_t col_begin, const Tensor& dst) {
#ifdef LOOM_WITH_CUDA
  LOOM_CHECK_SAME_DEVICE("copy_columns", src, dst);
#endif
  if (src.device() == Device::kCpu) return cpu::copy_columns(src, col_begin, dst);
#ifdef LOOM_WITH_CUDA
  return cuda::copy_columns(src, col_begin, dst);
#else
  LOOM_CHECK(false, "copy_columns: %s tensor in a build without CUDA", src.describe().c_str());
#endif
}

void scatter_columns(const Tensor& src, int64_t col_begin, const Tensor& dst) {
#ifdef LOOM_WITH_CUDA
  LOOM_CHECK_SAME_DEVICE("scatter_columns", src, dst);
#endif
  if (src.device() == Device::kCpu) return cpu::scatter_columns(src, col_begin, dst);
#ifdef LOOM_WITH_CUDA
  return cuda::scatter_columns(src, col_begin, dst);
#else
  LOOM_CHECK(false, "scatter_columns: %s tensor in a build without CUDA", src.describe().c_str());
#endif
}

void gather_rows(const Tensor& src, const std::vector<int64_t>& rows, const Tensor& dst) {
#ifdef LOOM_WITH_CUDA
  LOOM_CHECK_SAME_DEVICE("gather_rows", src, dst);
#endif
  if (src.device() == Device::kCpu) return cpu::gather_rows(src, rows, dst);
#ifdef LOOM_WITH_CUDA
  return cuda::gather_rows(src, rows, dst);
#else
  LOOM_CHECK(false, "gather_rows: %s tensor in a build without CUDA", src.describe().c_str());
#endif
}

}  // namespace loom
