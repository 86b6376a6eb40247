// CUDA GEMM through cuBLAS (f32, CUBLAS_DEFAULT_MATH: no TF32), on the handle of the Exec's
// device context (kernels/cuda/context.h).
#include "kernels/cuda/gemm.h"

#include <cublas_v2.h>

#include <climits>

#include "kernels/cuda/device.h"

namespace loom::cuda {
namespace {

#define LOOM_CUBLAS_CHECK(call)                                                                   \
  do {                                                                                            \
    const cublasStatus_t loom_cublas_st_ = (call);                                                \
    LOOM_CHECK(loom_cublas_st_ == CUBLAS_STATUS_SUCCESS, "cuBLAS call %s failed: %s (%d)", #call, \
               cublasGetStatusString(loom_cublas_st_), static_cast<int>(loom_cublas_st_));        \
  } while (0)

// Row-major out[m, n] = alpha op(a) op(b) + beta out is column-major out^T = op(b)^T op(a)^T: a
// row-major matrix with row length ld is the column-major transpose with leading dimension ld.
void sgemm_rowmajor(const Exec& ex, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                    float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                    float beta, float* c, int64_t ldc) {
  LOOM_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX &&
                 ldc <= INT_MAX,
             "sgemm (CUDA): size beyond 32-bit cuBLAS indices (m=%d n=%d k=%d)", m, n, k);
  if (m == 0 || n == 0) return;
  if (k == 0) {  // out = beta * out, and beta = 0 must not read out
    LOOM_CHECK(ldc == n, "sgemm (CUDA): strided out with k = 0");
    launch::fill_or_scale(stream_of(ex), c, m * n, beta);
    return;
  }
  if (m == 1) {
    // One row (decode): a matrix-vector product; cuBLAS's Sgemm and Sgemv reached only about
    // 2.1-2.3 TB/s on the H200 for a 4096 x 4096 weight, so linear_forward's layout (b [n, k],
    // a contiguous) uses Loom's warp-per-row kernel. Other layouts go to cublasSgemv: row-major
    // b [n, k] is the column-major k x n matrix B' with ld k (out = B'^T a), row-major b [k, n]
    // the column-major n x k matrix with ld n (out = B' a). beta = 0 never reads out.
    const int inc_a = trans_a ? static_cast<int>(lda) : 1;
    if (trans_b && inc_a == 1 && ldb == k) {
      launch::gemv_rows(stream_of(ex), b, a, c, n, k, alpha, beta);
    } else if (trans_b) {
      LOOM_CUBLAS_CHECK(cublasSgemv(device_context(ex.device.index).blas, CUBLAS_OP_T,
                                    static_cast<int>(k), static_cast<int>(n), &alpha, b,
                                    static_cast<int>(ldb), a, inc_a, &beta, c, 1));
    } else {
      LOOM_CUBLAS_CHECK(cublasSgemv(device_context(ex.device.index).blas, CUBLAS_OP_N,
                                    static_cast<int>(n), static_cast<int>(k), &alpha, b,
                                    static_cast<int>(ldb), a, inc_a, &beta, c, 1));
    }
    return;
  }
  LOOM_CUBLAS_CHECK(
      cublasSgemm(device_context(ex.device.index).blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                  trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                  static_cast<int>(k), &alpha, b, static_cast<int>(ldb), a, static_cast<int>(lda),
                  &beta, c, static_cast<int>(ldc)));
}

}  // namespace

void linear_forward(const Exec& ex, const Tensor& x, const Tensor& w, const Tensor& out,
                    float beta) {
  LOOM_CHECK_CUDA_ARG("linear_forward", x);
  LOOM_CHECK_CUDA_ARG("linear_forward", w);
  LOOM_CHECK_CUDA_ARG("linear_forward", out);
  LOOM_CHECK_F32(x);
  LOOM_CHECK_F32(w);
  LOOM_CHECK_F32(out);
  LOOM_CHECK(w.ndim() == 2 && x.ndim() >= 1 && out.ndim() == x.ndim(),
             "linear_forward: x %s w %s out %s", x.describe().c_str(), w.describe().c_str(),
             out.describe().c_str());
  const int64_t n = w.dim(0), k = w.dim(1);
  LOOM_CHECK(x.dim(-1) == k && out.dim(-1) == n, "linear_forward: x %s w %s out %s",
             x.describe().c_str(), w.describe().c_str(), out.describe().c_str());
  for (int i = 0; i + 1 < x.ndim(); ++i) {
    LOOM_CHECK(x.dim(i) == out.dim(i), "linear_forward: x %s vs out %s", x.describe().c_str(),
               out.describe().c_str());
  }
  const int64_t m = k > 0 ? x.numel() / k : out.numel() / (n > 0 ? n : 1);
  sgemm_rowmajor(ex, false, true, m, n, k, 1.0f, x.data<float>(), k, w.data<float>(), k, beta,
                 out.data<float>(), n);
}

void matmul(const Exec& ex, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
            const Tensor& out, float alpha, float beta) {
  LOOM_CHECK_CUDA_ARG("matmul", a);
  LOOM_CHECK_CUDA_ARG("matmul", b);
  LOOM_CHECK_CUDA_ARG("matmul", out);
  LOOM_CHECK_F32(a);
  LOOM_CHECK_F32(b);
  LOOM_CHECK_F32(out);
  LOOM_CHECK(a.ndim() == 2 && b.ndim() == 2 && out.ndim() == 2, "matmul: a %s b %s out %s",
             a.describe().c_str(), b.describe().c_str(), out.describe().c_str());
  const int64_t m = trans_a ? a.dim(1) : a.dim(0);
  const int64_t k = trans_a ? a.dim(0) : a.dim(1);
  const int64_t kb = trans_b ? b.dim(1) : b.dim(0);
  const int64_t n = trans_b ? b.dim(0) : b.dim(1);
  LOOM_CHECK(k == kb && out.dim(0) == m && out.dim(1) == n, "matmul: a %s%s b %s%s out %s",
             a.describe().c_str(), trans_a ? "^T" : "", b.describe().c_str(), trans_b ? "^T" : "",
             out.describe().c_str());
  sgemm_rowmajor(ex, trans_a, trans_b, m, n, k, alpha, a.data<float>(), a.dim(1), b.data<float>(),
                 b.dim(1), beta, out.data<float>(), n);
}

}  // namespace loom::cuda
