#include "kernels/cpu/elementwise.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace loom::cpu {
namespace {
constexpr int64_t kParallelThreshold = 1 << 15;  // below this, thread start-up costs more
}

void add_inplace(const Tensor& dst, const Tensor& src) {
  LOOM_CHECK_F32(dst);
  LOOM_CHECK_F32(src);
  LOOM_CHECK(dst.shape() == src.shape(), "add_inplace %s += %s", dst.describe().c_str(),
             src.describe().c_str());
  float* d = dst.data<float>();
  const float* s = src.data<float>();
  const int64_t n = dst.numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) d[i] += s[i];
}

void add_bias(const Tensor& x, const Tensor& bias) {
  LOOM_CHECK_F32(x);
  LOOM_CHECK_F32(bias);
  LOOM_CHECK(x.ndim() == 2 && bias.numel() == x.dim(1), "add_bias %s + %s", x.describe().c_str(),
             bias.describe().c_str());
  const int64_t n = x.dim(0), c = x.dim(1);
  float* p = x.data<float>();
  const float* b = bias.data<float>();
#pragma omp parallel for schedule(static) if (n * c > kParallelThreshold)
  for (int64_t r = 0; r < n; ++r) {
#pragma omp simd
    for (int64_t i = 0; i < c; ++i) p[r * c + i] += b[i];
  }
}

void mul_sigmoid_inplace(const Tensor& x, const Tensor& gate) {
  LOOM_CHECK_F32(x);
  LOOM_CHECK_F32(gate);
  LOOM_CHECK(x.numel() == gate.numel(), "mul_sigmoid_inplace %s by %s", x.describe().c_str(),
             gate.describe().c_str());
  float* p = x.data<float>();
  const float* g = gate.data<float>();
  const int64_t n = x.numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) p[i] *= 1.0f / (1.0f + std::exp(-g[i]));
}

void mul_sigmoid_rows(const Tensor& x, const Tensor& gate) {
  LOOM_CHECK_F32(x);
  LOOM_CHECK_F32(gate);
  LOOM_CHECK(x.ndim() == 2 && gate.numel() == x.dim(0), "mul_sigmoid_rows %s by %s",
             x.describe().c_str(), gate.describe().c_str());
  const int64_t n = x.dim(0), c = x.dim(1);
  float* p = x.data<float>();
  const float* g = gate.data<float>();
#pragma omp parallel for schedule(static) if (n * c > kParallelThreshold)
  for (int64_t r = 0; r < n; ++r) {
    const float s = 1.0f / (1.0f + std::exp(-g[r]));
    for (int64_t i = 0; i < c; ++i) p[r * c + i] *= s;
  }
}

void mul_silu_inplace(const Tensor& x, const Tensor& gate) {
  LOOM_CHECK_F32(x);
  LOOM_CHECK_F32(gate);
  LOOM_CHECK(x.numel() == gate.numel(), "mul_silu_inplace %s by %s", x.describe().c_str(),
             gate.describe().c_str());
  float* p = x.data<float>();
  const float* g = gate.data<float>();
  const int64_t n = x.numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) p[i] *= g[i] / (1.0f + std::exp(-g[i]));
}

void sigmoid_inplace(const Tensor& x) {
  LOOM_CHECK_F32(x);
  float* p = x.data<float>();
  const int64_t n = x.numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) p[i] = 1.0f / (1.0f + std::exp(-p[i]));
}

void copy_columns(const Tensor& src, int64_t col_begin, const Tensor& dst) {
  LOOM_CHECK_F32(src);
  LOOM_CHECK_F32(dst);
  LOOM_CHECK(src.ndim() == 2 && dst.ndim() == 2 && src.dim(0) == dst.dim(0) && col_begin >= 0 &&
                 col_begin + dst.dim(1) <= src.dim(1),
             "copy_columns from %s at %lld into %s", src.describe().c_str(),
             static_cast<long long>(col_begin), dst.describe().c_str());
  const int64_t n = src.dim(0), cs = src.dim(1), cd = dst.dim(1);
  const float* s = src.data<float>() + col_begin;
  float* d = dst.data<float>();
#pragma omp parallel for schedule(static) if (n * cd > kParallelThreshold)
  for (int64_t r = 0; r < n; ++r) std::memcpy(d + r * cd, s + r * cs, cd * sizeof(float));
}

void scatter_columns(const Tensor& src, int64_t col_begin, const Tensor& dst) {
  LOOM_CHECK_F32(src);
  LOOM_CHECK_F32(dst);
  LOOM_CHECK(src.ndim() == 2 && dst.ndim() == 2 && src.dim(0) == dst.dim(0) && col_begin >= 0 &&
                 col_begin + src.dim(1) <= dst.dim(1),
             "scatter_columns of %s at %lld into %s", src.describe().c_str(),
             static_cast<long long>(col_begin), dst.describe().c_str());
  const int64_t n = src.dim(0), cs = src.dim(1), cd = dst.dim(1);
  const float* s = src.data<float>();
  float* d = dst.data<float>() + col_begin;
#pragma omp parallel for schedule(static) if (n * cs > kParallelThreshold)
  for (int64_t r = 0; r < n; ++r) std::memcpy(d + r * cd, s + r * cs, cs * sizeof(float));
}

void gather_rows(const Tensor& src, const Tensor& row_ids, const Tensor& dst) {
  LOOM_CHECK_F32(src);
  LOOM_CHECK_F32(dst);
  LOOM_CHECK(row_ids.ndim() == 1 && row_ids.dtype() == DType::kI64 && row_ids.is_contiguous(),
             "gather_rows: rows must be contiguous i64 [n], got %s", row_ids.describe().c_str());
  LOOM_CHECK(src.ndim() == 2 && dst.ndim() == 2 && src.dim(1) == dst.dim(1) &&
                 dst.dim(0) == row_ids.dim(0),
             "gather_rows of %s from %s into %s", row_ids.describe().c_str(),
             src.describe().c_str(), dst.describe().c_str());
  const int64_t c = src.dim(1);
  const int64_t* rows = row_ids.data<int64_t>();
  for (int64_t i = 0; i < row_ids.dim(0); ++i) {
    LOOM_CHECK(rows[i] >= 0 && rows[i] < src.dim(0), "gather_rows: row %lld of %lld",
               static_cast<long long>(rows[i]), static_cast<long long>(src.dim(0)));
    std::memcpy(dst.data<float>() + i * c, src.data<float>() + rows[i] * c, c * sizeof(float));
  }
}

// Threads split the columns; each column is summed over the rows in order, so the sum is the same
// whatever the thread count.
void add_bias_backward(const Tensor& dx, const Tensor& dbias) {
  const int64_t n = dx.dim(0), c = dx.dim(1);
  const float* g = dx.data<float>();
  float* db = dbias.data<float>();
  constexpr int64_t kCols = 64;
#pragma omp parallel for schedule(static) if (n * c > kParallelThreshold)
  for (int64_t c0 = 0; c0 < c; c0 += kCols) {
    const int64_t c1 = std::min(c, c0 + kCols);
    float acc[kCols] = {};
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = c0; i < c1; ++i) acc[i - c0] += g[r * c + i];
    for (int64_t i = c0; i < c1; ++i) db[i] += acc[i - c0];
  }
}

void mul_gate_backward(const Tensor& x, const Tensor& gate, const Tensor& dout, const Tensor& dx,
                       const Tensor& dgate, bool silu) {
  const float* xp = x.data<float>();
  const float* gp = gate.data<float>();
  const float* dp = dout.data<float>();
  float* dxp = dx.data<float>();
  float* dgp = dgate.data<float>();
  const int64_t n = x.numel();
  if (silu) {
#pragma omp parallel for simd schedule(static) if (n > kParallelThreshold)
    for (int64_t i = 0; i < n; ++i) {
      const float xi = xp[i], gi = gp[i], di = dp[i];
      const float s = 1.0f / (1.0f + std::exp(-gi));
      const float sn = 1.0f / (1.0f + std::exp(gi));  // 1 - s without its cancellation near s = 1
      dxp[i] = di * (gi * s);
      dgp[i] = di * xi * (s * (1.0f + gi * sn));
    }
  } else {
#pragma omp parallel for simd schedule(static) if (n > kParallelThreshold)
    for (int64_t i = 0; i < n; ++i) {
      const float xi = xp[i], gi = gp[i], di = dp[i];
      const float s = 1.0f / (1.0f + std::exp(-gi));
      const float sn = 1.0f / (1.0f + std::exp(gi));  // 1 - s without its cancellation near s = 1
      dxp[i] = di * s;
      dgp[i] = di * xi * (s * sn);
    }
  }
}

// Rows are independent: a row's dot product runs in order, then the row of dx is written (so dx
// may alias x or dout, dgate may alias gate).
void mul_sigmoid_rows_backward(const Tensor& x, const Tensor& gate, const Tensor& dout,
                               const Tensor& dx, const Tensor& dgate) {
  const int64_t n = x.dim(0), c = x.dim(1);
  const float* xp = x.data<float>();
  const float* gp = gate.data<float>();
  const float* dp = dout.data<float>();
  float* dxp = dx.data<float>();
  float* dgp = dgate.data<float>();
#pragma omp parallel for schedule(static) if (n * c > kParallelThreshold)
  for (int64_t r = 0; r < n; ++r) {
    const float s = 1.0f / (1.0f + std::exp(-gp[r]));
    const float sn = 1.0f / (1.0f + std::exp(gp[r]));  // 1 - s without its cancellation
    float dot = 0.0f;
    for (int64_t i = 0; i < c; ++i) dot += dp[r * c + i] * xp[r * c + i];
    for (int64_t i = 0; i < c; ++i) dxp[r * c + i] = dp[r * c + i] * s;
    dgp[r] = dot * (s * sn);
  }
}

// From the output only, as torch does: 1 - y loses relative precision as y nears 1 (the gradient is
// then small in absolute terms).
void sigmoid_backward(const Tensor& y, const Tensor& dout, const Tensor& dx) {
  const float* yp = y.data<float>();
  const float* dp = dout.data<float>();
  float* dxp = dx.data<float>();
  const int64_t n = y.numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) dxp[i] = dp[i] * (yp[i] * (1.0f - yp[i]));
}

namespace {
template <typename Id>
void scatter_add(const char* op, const float* src, const Id* ids, int64_t n, int64_t c,
                 int64_t rows, float* dst) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = static_cast<int64_t>(ids[i]);
    LOOM_CHECK(id >= 0 && id < rows, "%s: ids[%lld] = %lld outside [0, %lld)", op,
               static_cast<long long>(i), static_cast<long long>(id), static_cast<long long>(rows));
  }
  // Threads split the columns, never the indices: a row of dst named by several indices gets
  // their rows added in index order, so the result is the same whatever the thread count.
  constexpr int64_t kCols = 64;
#pragma omp parallel for schedule(static) if (n * c > kParallelThreshold)
  for (int64_t c0 = 0; c0 < c; c0 += kCols) {
    const int64_t c1 = std::min(c, c0 + kCols);
    for (int64_t i = 0; i < n; ++i) {
      float* d = dst + static_cast<int64_t>(ids[i]) * c;
      const float* s = src + i * c;
      for (int64_t j = c0; j < c1; ++j) d[j] += s[j];
    }
  }
}
}  // namespace

void scatter_add_rows(const char* op, const Tensor& src, const Tensor& ids, const Tensor& dst) {
  const int64_t n = src.dim(0), c = src.dim(1), rows = dst.dim(0);
  if (ids.dtype() == DType::kI32) {
    scatter_add(op, src.data<float>(), ids.data<int32_t>(), n, c, rows, dst.data<float>());
  } else {
    scatter_add(op, src.data<float>(), ids.data<int64_t>(), n, c, rows, dst.data<float>());
  }
}

}  // namespace loom::cpu
