// Device dispatch for kernels/elementwise.h.
#include "kernels/elementwise.h"

#include <cstring>

#include "kernels/cpu/elementwise.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/backward.h"
#include "kernels/cuda/elementwise.h"
#endif

namespace loom {

namespace {
// The tensors of an elementwise backward: contiguous f32, all of `numel` elements.
void check_same_numel(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor& first = **ts.begin();
  for (const Tensor* t : ts) {
    LOOM_CHECK_F32(*t);
    LOOM_CHECK(t->numel() == first.numel(), "%s: %s vs %s", op, first.describe().c_str(),
               t->describe().c_str());
  }
}
}  // namespace

void zero_fill(const Exec& ex, const Tensor& t) {
  LOOM_ON_EXEC_DEVICE(ex, "zero_fill", t);
  LOOM_CHECK(t.is_contiguous(), "zero_fill: %s is not contiguous", t.describe().c_str());
  if (t.numel() == 0) return;
  if (ex.device.is_cpu()) {
    std::memset(t.raw(), 0, t.nbytes());
    return;
  }
#ifdef LOOM_WITH_CUDA
  return cuda::zero_fill(ex, t);
#else
  no_kernel_for(ex, "zero_fill");
#endif
}

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

void add_bias_backward(const Exec& ex, const Tensor& dx, const Tensor& dbias) {
  LOOM_ON_EXEC_DEVICE(ex, "add_bias_backward", dx, dbias);
  LOOM_CHECK_F32(dx);
  LOOM_CHECK_F32(dbias);
  LOOM_CHECK(dx.ndim() == 2 && dbias.numel() == dx.dim(1), "add_bias_backward: dx %s dbias %s",
             dx.describe().c_str(), dbias.describe().c_str());
  if (ex.device.is_cpu()) return cpu::add_bias_backward(dx, dbias);
#ifdef LOOM_WITH_CUDA
  return cuda::add_bias_backward(ex, dx, dbias);
#else
  no_kernel_for(ex, "add_bias_backward");
#endif
}

void mul_sigmoid_backward(const Exec& ex, const Tensor& x, const Tensor& gate, const Tensor& dout,
                          const Tensor& dx, const Tensor& dgate) {
  LOOM_ON_EXEC_DEVICE(ex, "mul_sigmoid_backward", x, gate, dout, dx, dgate);
  check_same_numel("mul_sigmoid_backward", {&x, &gate, &dout, &dx, &dgate});
  LOOM_CHECK(dx.raw() != dgate.raw() || x.numel() == 0, "mul_sigmoid_backward: dx aliases dgate");
  if (ex.device.is_cpu()) return cpu::mul_gate_backward(x, gate, dout, dx, dgate, false);
#ifdef LOOM_WITH_CUDA
  return cuda::mul_sigmoid_backward(ex, x, gate, dout, dx, dgate);
#else
  no_kernel_for(ex, "mul_sigmoid_backward");
#endif
}

void mul_sigmoid_rows_backward(const Exec& ex, const Tensor& x, const Tensor& gate,
                               const Tensor& dout, const Tensor& dx, const Tensor& dgate) {
  LOOM_ON_EXEC_DEVICE(ex, "mul_sigmoid_rows_backward", x, gate, dout, dx, dgate);
  check_same_numel("mul_sigmoid_rows_backward", {&x, &dout, &dx});
  check_same_numel("mul_sigmoid_rows_backward", {&gate, &dgate});
  LOOM_CHECK(x.ndim() == 2 && dout.shape() == x.shape() && dx.shape() == x.shape() &&
                 gate.numel() == x.dim(0),
             "mul_sigmoid_rows_backward: x %s gate %s dout %s dx %s", x.describe().c_str(),
             gate.describe().c_str(), dout.describe().c_str(), dx.describe().c_str());
  if (ex.device.is_cpu()) return cpu::mul_sigmoid_rows_backward(x, gate, dout, dx, dgate);
#ifdef LOOM_WITH_CUDA
  return cuda::mul_sigmoid_rows_backward(ex, x, gate, dout, dx, dgate);
#else
  no_kernel_for(ex, "mul_sigmoid_rows_backward");
#endif
}

void mul_silu_backward(const Exec& ex, const Tensor& x, const Tensor& gate, const Tensor& dout,
                       const Tensor& dx, const Tensor& dgate) {
  LOOM_ON_EXEC_DEVICE(ex, "mul_silu_backward", x, gate, dout, dx, dgate);
  check_same_numel("mul_silu_backward", {&x, &gate, &dout, &dx, &dgate});
  LOOM_CHECK(dx.raw() != dgate.raw() || x.numel() == 0, "mul_silu_backward: dx aliases dgate");
  if (ex.device.is_cpu()) return cpu::mul_gate_backward(x, gate, dout, dx, dgate, true);
#ifdef LOOM_WITH_CUDA
  return cuda::mul_silu_backward(ex, x, gate, dout, dx, dgate);
#else
  no_kernel_for(ex, "mul_silu_backward");
#endif
}

void sigmoid_backward(const Exec& ex, const Tensor& y, const Tensor& dout, const Tensor& dx) {
  LOOM_ON_EXEC_DEVICE(ex, "sigmoid_backward", y, dout, dx);
  check_same_numel("sigmoid_backward", {&y, &dout, &dx});
  if (ex.device.is_cpu()) return cpu::sigmoid_backward(y, dout, dx);
#ifdef LOOM_WITH_CUDA
  return cuda::sigmoid_backward(ex, y, dout, dx);
#else
  no_kernel_for(ex, "sigmoid_backward");
#endif
}

void gather_rows_backward(const Exec& ex, const Tensor& ddst, const Tensor& rows,
                          const Tensor& dsrc) {
  LOOM_ON_EXEC_DEVICE(ex, "gather_rows_backward", ddst, rows, dsrc);
  LOOM_CHECK(rows.ndim() == 1 && rows.dtype() == DType::kI64 && rows.is_contiguous(),
             "gather_rows_backward: rows must be contiguous i64 [n], got %s",
             rows.describe().c_str());
  LOOM_CHECK_F32(ddst);
  LOOM_CHECK_F32(dsrc);
  LOOM_CHECK(ddst.ndim() == 2 && dsrc.ndim() == 2 && ddst.dim(0) == rows.dim(0) &&
                 ddst.dim(1) == dsrc.dim(1),
             "gather_rows_backward: ddst %s rows %s dsrc %s", ddst.describe().c_str(),
             rows.describe().c_str(), dsrc.describe().c_str());
  if (ex.device.is_cpu()) return cpu::scatter_add_rows("gather_rows_backward", ddst, rows, dsrc);
#ifdef LOOM_WITH_CUDA
  return cuda::scatter_add_rows(ex, "gather_rows_backward", ddst, rows, dsrc);
#else
  no_kernel_for(ex, "gather_rows_backward");
#endif
}

}  // namespace loom
