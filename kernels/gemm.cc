// Device dispatch for kernels/gemm.h. CPU only in this build: there is no CUDA GEMM kernel yet.
#include "kernels/gemm.h"

#include "kernels/cpu/gemm.h"

namespace loom {

void linear_forward(const Tensor& x, const Tensor& w, const Tensor& out, float beta) {
  if (x.device() == Device::kCpu) return cpu::linear_forward(x, w, out, beta);
  LOOM_CHECK(false, "linear_forward: no CUDA kernel in this build yet (%s)", x.describe().c_str());
}

void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& out,
            float alpha, float beta) {
  if (a.device() == Device::kCpu) return cpu::matmul(a, trans_a, b, trans_b, out, alpha, beta);
  LOOM_CHECK(false, "matmul: no CUDA kernel in this build yet (%s)", a.describe().c_str());
}

}  // namespace loom
