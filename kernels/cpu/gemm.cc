#include "kernels/cpu/gemm.h"

#include <cblas.h>

#include <climits>

namespace loom::cpu {

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  LOOM_CHECK(m >= 0 && n >= 0 && k >= 0, "sgemm: negative size m=%d n=%d k=%d", m, n, k);
  LOOM_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX &&
                 ldc <= INT_MAX,
             "sgemm: size beyond 32-bit BLAS indices (m=%d n=%d k=%d)", m, n, k);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // BLAS would do this too; done here so beta = 0 never reads (possibly NaN) c.
#pragma omp parallel for schedule(static) if (m * n > 65536)
    for (int64_t i = 0; i < m; ++i) {
      float* row = c + i * ldc;
      if (beta == 0.0f) {
        for (int64_t j = 0; j < n; ++j) row[j] = 0.0f;
      } else {
        for (int64_t j = 0; j < n; ++j) row[j] *= beta;
      }
    }
    return;
  }
  if (m == 1) {
    // A single row is a matrix-vector product: OpenBLAS 0.3.21 does not forward M = 1 GEMMs to
    // GEMV and would pack all of op(b), so call sgemv (same result, about twice the bandwidth).
    // c is zeroed first for beta = 0 so garbage (NaN) in c can never leak through a 0 * NaN.
    if (beta == 0.0f) {
      for (int64_t j = 0; j < n; ++j) c[j] = 0.0f;
    }
    const int incx = trans_a ? static_cast<int>(lda) : 1;
    if (trans_b) {  // b: [n, k]; c = b @ a_row
      cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(n), static_cast<int>(k), alpha, b,
                  static_cast<int>(ldb), a, incx, beta, c, 1);
    } else {  // b: [k, n]; c = b^T @ a_row
      cblas_sgemv(CblasRowMajor, CblasTrans, static_cast<int>(k), static_cast<int>(n), alpha, b,
                  static_cast<int>(ldb), a, incx, beta, c, 1);
    }
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

void linear_forward(const Tensor& x, const Tensor& w, const Tensor& out, float beta) {
  LOOM_CHECK_F32(x);
  LOOM_CHECK_F32(w);
  LOOM_CHECK_F32(out);
  LOOM_CHECK(w.ndim() == 2 && x.ndim() >= 1 && out.ndim() == x.ndim(),
             "linear_forward: x %s w %s out %s", x.describe().c_str(), w.describe().c_str(),
             out.describe().c_str());
  const int64_t n = w.dim(0);
  const int64_t k = w.dim(1);
  LOOM_CHECK(x.dim(-1) == k && out.dim(-1) == n, "linear_forward: x %s w %s out %s",
             x.describe().c_str(), w.describe().c_str(), out.describe().c_str());
  for (int i = 0; i + 1 < x.ndim(); ++i) {
    LOOM_CHECK(x.dim(i) == out.dim(i), "linear_forward: x %s vs out %s", x.describe().c_str(),
               out.describe().c_str());
  }
  const int64_t m = k > 0 ? x.numel() / k : out.numel() / (n > 0 ? n : 1);
  sgemm(false, true, m, n, k, 1.0f, x.data<float>(), k, w.data<float>(), k, beta, out.data<float>(),
        n);
}

void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& out,
            float alpha, float beta) {
  LOOM_CHECK_F32(a);
  LOOM_CHECK_F32(b);
  LOOM_CHECK_F32(out);
  LOOM_CHECK(a.ndim() == 2 && b.ndim() == 2 && out.ndim() == 2, "matmul: a %s b %s out %s",
             a.describe().c_str(), b.describe().c_str(), out.describe().c_str());
  const int64_t m = trans_a ? a.dim(1) : a.dim(0);
  const int64_t k = trans_a ? a.dim(0) : a.dim(1);
  const int64_t kb = trans_b ? b.dim(1) : b.dim(0);
  const int64_t n = trans_b ? b.dim(0) : b.dim(1);
  LOOM_CHECK(k == kb && out.dim(0) == m && out.dim(1) == n,
             "matmul: a %s%s b %s%s out %s: shapes do not compose", a.describe().c_str(),
             trans_a ? "^T" : "", b.describe().c_str(), trans_b ? "^T" : "",
             out.describe().c_str());
  sgemm(trans_a, trans_b, m, n, k, alpha, a.data<float>(), a.dim(1), b.data<float>(), b.dim(1),
        beta, out.data<float>(), n);
}

}  // namespace loom::cpu
