// Device dispatch for kernels/elementwise.h.
#include "kernels/elementwise.h"

#include "kernels/cpu/elementwise.h"

namespace loom {

void add_inplace(const Tensor& dst, const Tensor& src) {
  LOOM_CHECK(dst.device() == Device::kCpu, "add_inplace: no CUDA kernel in this build yet");
  cpu::add_inplace(dst, src);
}

void add_bias(const Tensor& x, const Tensor& bias) {
  LOOM_CHECK(x.device() == Device::kCpu, "add_bias: no CUDA kernel in this build yet");
  cpu::add_bias(x, bias);
}

void mul_sigmoid_inplace(const Tensor& x, const Tensor& gate) {
  LOOM_CHECK(x.device() == Device::kCpu, "mul_sigmoid_inplace: no CUDA kernel in this build yet");
  cpu::mul_sigmoid_inplace(x, gate);
}

void mul_sigmoid_rows(const Tensor& x, const Tensor& gate) {
  LOOM_CHECK(x.device() == Device::kCpu, "mul_sigmoid_rows: no CUDA kernel in this build yet");
  cpu::mul_sigmoid_rows(x, gate);
}

void mul_silu_inplace(const Tensor& x, const Tensor& gate) {
  LOOM_CHECK(x.device() == Device::kCpu, "mul_silu_inplace: no CUDA kernel in this build yet");
  cpu::mul_silu_inplace(x, gate);
}

void sigmoid_inplace(const Tensor& x) {
  LOOM_CHECK(x.device() == Device::kCpu, "sigmoid_inplace: no CUDA kernel in this build yet");
  cpu::sigmoid_inplace(x);
}

void copy_columns(const Tensor& src, int64_t col_begin, const Tensor& dst) {
  LOOM_CHECK(src.device() == Device::kCpu, "copy_columns: no CUDA kernel in this build yet");
  cpu::copy_columns(src, col_begin, dst);
}

void scatter_columns(const Tensor& src, int64_t col_begin, const Tensor& dst) {
  LOOM_CHECK(src.device() == Device::kCpu, "scatter_columns: no CUDA kernel in this build yet");
  cpu::scatter_columns(src, col_begin, dst);
}

void gather_rows(const Tensor& src, const std::vector<int64_t>& rows, const Tensor& dst) {
  LOOM_CHECK(src.device() == Device::kCpu, "gather_rows: no CUDA kernel in this build yet");
  cpu::gather_rows(src, rows, dst);
}

}  // namespace loom
