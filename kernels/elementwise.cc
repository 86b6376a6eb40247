// Device dispatch for kernels/elementwise.h.
#include "kernels/elementwise.h"

#include "kernels/cpu/elementwise.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/elementwise.h"
#endif

namespace loom {

void add_inplace(const Exec& ex, const Tensor& dst, const Tensor& src) {
  LOOM_ON_EXEC_DEVICE(ex, "add_inplace", dst, src);
  if (ex.device.is_cpu()) return cpu::add_inplace(dst, src);
#ifdef LOOM_WITH_CUDA
  return cuda::add_inplace(ex, dst, src);
#else
  no_kernel_for(ex, "add_inplace");
#endif
}

void add_bias(const Exec& ex, const Tensor& x, const Tensor& bias) {
  LOOM_ON_EXEC_DEVICE(ex, "add_bias", x, bias);
  if (ex.device.is_cpu()) return cpu::add_bias(x, bias);
#ifdef LOOM_WITH_CUDA
  return cuda::add_bias(ex, x, bias);
#else
  no_kernel_for(ex, "add_bias");
#endif
}

void mul_sigmoid_inplace(const Exec& ex, const Tensor& x, const Tensor& gate) {
  LOOM_ON_EXEC_DEVICE(ex, "mul_sigmoid_inplace", x, gate);
  if (ex.device.is_cpu()) return cpu::mul_sigmoid_inplace(x, gate);
#ifdef LOOM_WITH_CUDA
  return cuda::mul_sigmoid_inplace(ex, x, gate);
#else
  no_kernel_for(ex, "mul_sigmoid_inplace");
#endif
}

void mul_sigmoid_rows(const Exec& ex, const Tensor& x, const Tensor& gate) {
  LOOM_ON_EXEC_DEVICE(ex, "mul_sigmoid_rows", x, gate);
  if (ex.device.is_cpu()) return cpu::mul_sigmoid_rows(x, gate);
#ifdef LOOM_WITH_CUDA
  return cuda::mul_sigmoid_rows(ex, x, gate);
#else
  no_kernel_for(ex, "mul_sigmoid_rows");
#endif
}

void mul_silu_inplace(const Exec& ex, const Tensor& x, const Tensor& gate) {
  LOOM_ON_EXEC_DEVICE(ex, "mul_silu_inplace", x, gate);
  if (ex.device.is_cpu()) return cpu::mul_silu_inplace(x, gate);
#ifdef LOOM_WITH_CUDA
  return cuda::mul_silu_inplace(ex, x, gate);
#else
  no_kernel_for(ex, "mul_silu_inplace");
#endif
}

void sigmoid_inplace(const Exec& ex, const Tensor& x) {
  LOOM_ON_EXEC_DEVICE(ex, "sigmoid_inplace", x);
  if (ex.device.is_cpu()) return cpu::sigmoid_inplace(x);
#ifdef LOOM_WITH_CUDA
  return cuda::sigmoid_inplace(ex, x);
#else
  no_kernel_for(ex, "sigmoid_inplace");
#endif
}

void copy_columns(const Exec& ex, const Tensor& src, int64_t col_begin, const Tensor& dst) {
  LOOM_ON_EXEC_DEVICE(ex, "copy_columns", src, dst);
  if (ex.device.is_cpu()) return cpu::copy_columns(src, col_begin, dst);
#ifdef LOOM_WITH_CUDA
  return cuda::copy_columns(ex, src, col_begin, dst);
#else
  no_kernel_for(ex, "copy_columns");
#endif
}

void scatter_columns(const Exec& ex, const Tensor& src, int64_t col_begin, const Tensor& dst) {
  LOOM_ON_EXEC_DEVICE(ex, "scatter_columns", src, dst);
  if (ex.device.is_cpu()) return cpu::scatter_columns(src, col_begin, dst);
#ifdef LOOM_WITH_CUDA
  return cuda::scatter_columns(ex, src, col_begin, dst);
#else
  no_kernel_for(ex, "scatter_columns");
#endif
}

void gather_rows(const Exec& ex, const Tensor& src, const Tensor& rows, const Tensor& dst) {
  LOOM_ON_EXEC_DEVICE(ex, "gather_rows", src, rows, dst);
  if (ex.device.is_cpu()) return cpu::gather_rows(src, rows, dst);
#ifdef LOOM_WITH_CUDA
  return cuda::gather_rows(ex, src, rows, dst);
#else
  no_kernel_for(ex, "gather_rows");
#endif
}

}  // namespace loom
