#include "kernels/cpu/elementwise.h"

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

}  // namespace loom::cpu
