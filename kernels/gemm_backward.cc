#include "kernels/gemm_backward.h"

#include "kernels/gemm.h"

namespace loom {

void linear_backward(const Exec& ex, const Tensor& x, const Tensor& w, const Tensor& d_out,
                     const Tensor& d_x, float beta, const Tensor& d_w) {
  static constexpr const char* kOp = "linear_backward";
  LOOM_ON_EXEC_DEVICE(ex, kOp, x, w, d_out, d_w);
  for (const Tensor* t : {&x, &w, &d_out, &d_w}) LOOM_CHECK_F32(*t);
  LOOM_CHECK(x.ndim() == 2 && w.ndim() == 2 && d_out.ndim() == 2 && x.dim(1) == w.dim(1) &&
                 d_out.dim(0) == x.dim(0) && d_out.dim(1) == w.dim(0) && d_w.shape() == w.shape(),
             "%s: x %s w %s d_out %s d_w %s", kOp, x.describe().c_str(), w.describe().c_str(),
             d_out.describe().c_str(), d_w.describe().c_str());
  if (d_x.defined()) {
    LOOM_ON_EXEC_DEVICE(ex, kOp, d_x);
    LOOM_CHECK(d_x.shape() == x.shape(), "%s: d_x %s for x %s", kOp, d_x.describe().c_str(),
               x.describe().c_str());
    matmul(ex, d_out, false, w, false, d_x, 1.0f, beta);
  }
  matmul(ex, d_out, true, x, false, d_w, 1.0f, 1.0f);
}

}  // namespace loom
