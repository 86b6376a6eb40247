#include "kernels/cpu/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "core/fp8_matrix.h"

namespace loom::cpu {
namespace {

// bf16 weights: up to this many rows the row-invariant kernel on widened panels beats widening
// for OpenBLAS (2048 x 2048, 2 threads, min of 7: Xeon with OpenBLAS's Haswell kernels, 9-32
// rows 0.77-2.0 ms against 2.2-3.2 ms; Zen 3, one thread, even to 1.1x either way up to 64 rows).
constexpr int64_t kBf16RowKernelRows = 32;

// Products of a few rows (decode batches, MoE experts with few tokens) are computed here rather
// than by OpenBLAS 0.3.21, whose sgemm packs all of op(b) on every call: for a 2048 x 2048 weight
// on the 2-core CPU it took 1.7-2.0 ms for 2-8 rows where this kernel takes 0.27-0.79 ms (one
// row: 0.18 ms through sgemv). From 16 rows on, OpenBLAS's packed kernel is as fast or faster.
constexpr int64_t kSmallM = 8;

// Eight floats in a vector register (AVX/AVX2; AVX-512 machines run two per instruction or
// split): GCC's vector extension keeps this portable C++ without per-ISA intrinsics.
typedef float v8f __attribute__((vector_size(32)));

inline v8f load8(const float* p) {
  v8f v;
  __builtin_memcpy(&v, p, sizeof v);  // unaligned load
  return v;
}

// Eight bf16 weights widened to f32 in registers (exact: a bf16 is the upper half of an f32), so
// the arithmetic after the load is the f32 kernel's, operation for operation.
typedef uint16_t v8u16 __attribute__((vector_size(16)));
typedef uint32_t v8u32 __attribute__((vector_size(32)));
inline v8f load8(const uint16_t* p) {
  v8u16 h;
  __builtin_memcpy(&h, p, sizeof h);
  const v8u32 w = __builtin_convertvector(h, v8u32) << 16;
  v8f v;
  __builtin_memcpy(&v, &w, sizeof v);
  return v;
}

inline float widen(float v) { return v; }
inline float widen(uint16_t v) { return bf16_to_f32(v); }

inline float sum8(v8f v) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

// out[r * C + c] = dot(a[r], b[c]) over k for an R x C tile: R rows of a against C rows of b
// (b transposed, [n, k]). Each step loads R + C vectors for R * C multiply-adds, so with R = C =
// 4 the loads no longer bound the loop.
template <int R, int C, typename B>
inline void dot_tile(const float* const* a, const B* const* b, int64_t k, float* out) {
  v8f acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = v8f{};
  }
  int64_t l = 0;
  for (; l + 8 <= k; l += 8) {
    v8f bv[C];
    for (int c = 0; c < C; ++c) bv[c] = load8(b[c] + l);
    for (int r = 0; r < R; ++r) {
      const v8f av = load8(a[r] + l);
      for (int c = 0; c < C; ++c) acc[r][c] += av * bv[c];
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      float s = sum8(acc[r][c]);
      // An explicit fma: left to itself the compiler contracted a * b + s for some (row,
      // column) pairs of a tile and not others, so a row's tail depended on its tile position
      // and on the instantiation.
      for (int64_t t = l; t < k; ++t) s = std::fma(a[r][t], widen(b[c][t]), s);
      out[r * C + c] = s;
    }
  }
}

void store(float* c, float v, float alpha, float beta) {
  *c = beta == 0.0f ? alpha * v : alpha * v + beta * *c;  // beta = 0 never reads c (may be NaN)
}

// Rows per pass over b: 64 rows of a (k = 2048: 512 KiB) stay in L2 while b's tiles stream.
constexpr int64_t kRowBlock = 64;

// The b: [n, k] case of row_invariant_sgemm (below): c[i, j] = dot(a row i, b row j), in 4 x 4
// tiles, for f32 or bf16 b (widened in registers: the same f32 operations on the same values).
// `threaded`: false when the caller already runs it inside its own parallel loop.
template <typename B>
void row_invariant_bt(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                      const B* b, int64_t ldb, float beta, float* c, int64_t ldc,
                      bool threaded = true) {
  const bool parallel = threaded && n * k >= (int64_t{1} << 15);
  constexpr int64_t kCols = 4;
  const int64_t col_tiles = (n + kCols - 1) / kCols;
  for (int64_t i0 = 0; i0 < m; i0 += kRowBlock) {
    const int64_t i1 = std::min(m, i0 + kRowBlock);
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t t = 0; t < col_tiles; ++t) {
      const int64_t j0 = t * kCols;
      const int64_t nc = std::min(kCols, n - j0);
      const B* cols[kCols];
      for (int64_t q = 0; q < kCols; ++q) cols[q] = b + (j0 + std::min(q, nc - 1)) * ldb;
      float tile[4 * kCols];
      // Tiles of 4 rows suit the few-row (bandwidth-bound) case; past that, 3 x 4 tiles keep
      // the 12 accumulators and 4 b vectors in AVX2's 16 registers (measured 20% faster on the
      // 2-core Zen 3 at 192 x 1536 x 2048, one thread). Each element's arithmetic is the same.
      const int64_t tile_rows = m > kSmallM ? 3 : 4;
      for (int64_t i = i0; i < i1; i += tile_rows) {
        const int64_t nr = std::min<int64_t>(tile_rows, i1 - i);
        const float* rows[4];
        for (int64_t r = 0; r < 4; ++r) rows[r] = a + (i + std::min(r, nr - 1)) * lda;
        // Short tiles repeat their last row/column (cheap, from cache) and drop the copies.
        if (nr == 4) {
          dot_tile<4, kCols>(rows, cols, k, tile);
        } else if (nr == 2) {
          dot_tile<2, kCols>(rows, cols, k, tile);
        } else if (nr == 1) {
          dot_tile<1, kCols>(rows, cols, k, tile);
        } else {
          dot_tile<3, kCols>(rows, cols, k, tile);
        }
        for (int64_t r = 0; r < nr; ++r) {
          for (int64_t q = 0; q < nc; ++q) {
            store(c + (i + r) * ldc + j0 + q, tile[r * kCols + q], alpha, beta);
          }
        }
      }
    }
  }
}

// c[m, n] = alpha * a[m, k] @ op(b) + beta * c with a not transposed, for any m. Every element
// of c is computed by the same operations whatever m is and wherever its row sits (a fixed 8-lane
// accumulation over k, then a fixed horizontal sum and tail), so this kernel is batch-invariant;
// it serves few-row products always and every product in batch-invariant mode. Each thread takes
// a range of output columns and reads its part of b once per block of rows.
void row_invariant_sgemm(bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                         int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                         int64_t ldc) {
  if (trans_b) {
    row_invariant_bt(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  const bool parallel = n * k >= (int64_t{1} << 15);
  // b: [k, n]; row i of c is sum_l a[i, l] * b[l, :] in order of l. Blocks of columns keep up to
  // kSmallM partial rows in registers/L1 while b streams by.
  constexpr int64_t kBlock = 256;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t j0 = blk * kBlock;
    const int64_t w = std::min(kBlock, n - j0);
    float acc[kSmallM][kBlock];
    for (int64_t i0 = 0; i0 < m; i0 += kSmallM) {
      const int64_t mr = std::min(kSmallM, m - i0);
      for (int64_t i = 0; i < mr; ++i) {
        for (int64_t j = 0; j < w; ++j) acc[i][j] = 0.0f;
      }
      for (int64_t l = 0; l < k; ++l) {
        const float* bl = b + l * ldb + j0;
        for (int64_t i = 0; i < mr; ++i) {
          const float ail = a[(i0 + i) * lda + l];
          float* ai = acc[i];
#pragma omp simd
          for (int64_t j = 0; j < w; ++j) ai[j] += ail * bl[j];
        }
      }
      for (int64_t i = 0; i < mr; ++i) {
        for (int64_t j = 0; j < w; ++j) store(c + (i0 + i) * ldc + j0 + j, acc[i][j], alpha, beta);
      }
    }
  }
}

}  // namespace

thread_local bool t_row_invariant = false;

namespace {

// c[m, n] = a[m, k] @ b^T + beta * c for a b [n, k] stored narrower than f32: `widen(j0, rows,
// dst)` writes rows [j0, j0 + rows) of b as f32 into dst ([rows, k], contiguous). Panels of b are
// widened once into per-thread scratch (reused from call to call) and each panel runs the f32
// product of the mode; m > 0, n > 0, k > 0.
template <typename Widen>
void widened_bt(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, float beta, float* c,
                int64_t ldc, const Widen& widen_rows) {
  if (t_row_invariant || m <= kBf16RowKernelRows) {
    // The row-invariant kernel, whose arithmetic per element does not depend on n (in
    // batch-invariant mode the same bits as f32 weights), on L2-sized panels (256 KiB, or 4 rows
    // of b if longer), one thread per panel: widened, then multiplied while still in cache.
    constexpr int64_t kL2PanelFloats = int64_t{1} << 16;
    const int64_t panel = std::max<int64_t>(4, kL2PanelFloats / k / 4 * 4);
    const int64_t panels = (n + panel - 1) / panel;
#pragma omp parallel for schedule(static) if (n * k >= (int64_t{1} << 15))
    for (int64_t p = 0; p < panels; ++p) {
      thread_local std::vector<float> scratch;
      const int64_t j0 = p * panel, np = std::min(panel, n - j0);
      if (scratch.size() < static_cast<size_t>(np * k)) scratch.resize(np * k);
      widen_rows(j0, np, scratch.data());
      row_invariant_bt(m, np, k, 1.0f, a, lda, static_cast<const float*>(scratch.data()), k, beta,
                       c + j0, ldc, /*threaded=*/false);
    }
    return;
  }
  // OpenBLAS re-packs a once per panel: panels of 8 rows of b per row of a (at least 64, so few
  // rows get L2-sized panels; at most 4 MiB, or 16 rows of b if longer) keep that re-packing small
  // next to the product.
  constexpr int64_t kPanelFloats = int64_t{1} << 20;
  const int64_t panel =
      std::min({n, std::max<int64_t>(16, kPanelFloats / k), std::max<int64_t>(64, 8 * m)});
  thread_local std::vector<float> scratch;
  if (scratch.size() < static_cast<size_t>(panel * k)) scratch.resize(panel * k);
  float* w = scratch.data();
  for (int64_t j0 = 0; j0 < n; j0 += panel) {
    const int64_t np = std::min(panel, n - j0);
    const int64_t chunk = 8;  // rows of b per task of the widening
#pragma omp parallel for schedule(static) if (np * k >= (int64_t{1} << 16))
    for (int64_t r = 0; r < np; r += chunk) widen_rows(j0 + r, std::min(chunk, np - r), w + r * k);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(np),
                static_cast<int>(k), 1.0f, a, static_cast<int>(lda), w, static_cast<int>(k), beta,
                c + j0, static_cast<int>(ldc));
  }
}

}  // namespace

RowInvariantScope::RowInvariantScope(bool on) : previous_(t_row_invariant) { t_row_invariant = on; }
RowInvariantScope::~RowInvariantScope() { t_row_invariant = previous_; }

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
  if (t_row_invariant) {
    // OpenBLAS's result for a row depends on how many rows come with it (its blocking, and GEMV
    // for one row); no forward op multiplies a transposed a.
    LOOM_CHECK(!trans_a, "sgemm: no batch-invariant kernel for a transposed a (m=%d n=%d k=%d)", m,
               n, k);
    return row_invariant_sgemm(trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
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
  if (!trans_a && m <= kSmallM) {
    return row_invariant_sgemm(trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

void sgemm_bf16_bt(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const uint16_t* b,
                   int64_t ldb, float beta, float* c, int64_t ldc) {
  LOOM_CHECK(m >= 0 && n >= 0 && k >= 0, "sgemm_bf16_bt: negative size m=%d n=%d k=%d", m, n, k);
  LOOM_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX &&
                 ldc <= INT_MAX,
             "sgemm_bf16_bt: size beyond 32-bit BLAS indices (m=%d n=%d k=%d)", m, n, k);
  if (m == 0 || n == 0) return;
  if (k == 0) {  // b is not read: sgemm's handling of c (beta = 0 writes zeros)
    return sgemm(false, true, m, n, 0, 1.0f, a, lda, nullptr, ldb, beta, c, ldc);
  }
  if (m <= kSmallM) {
    // Few rows are bound by reading b: the row-invariant kernel reads the bf16 directly (half the
    // bytes) and widens in registers; its products are the f32 kernel's exactly.
    return row_invariant_bt(m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
  }
  // More rows are bound by arithmetic: panels of b are widened once into per-thread scratch
  // (reused from call to call) and each panel runs the f32 product of the mode.
  widened_bt(m, n, k, a, lda, beta, c, ldc, [&](int64_t j0, int64_t rows, float* dst) {
    for (int64_t r = 0; r < rows; ++r) {
      const uint16_t* src = b + (j0 + r) * ldb;
      for (int64_t l = 0; l < k; ++l) dst[r * k + l] = bf16_to_f32(src[l]);
    }
  });
}

void sgemm_fp8_bt(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const uint8_t* b,
                  int64_t ldb, const float* scale_inv, int64_t ld_scale, float beta, float* c,
                  int64_t ldc) {
  LOOM_CHECK(m >= 0 && n >= 0 && k >= 0, "sgemm_fp8_bt: negative size m=%d n=%d k=%d", m, n, k);
  LOOM_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX &&
                 ldc <= INT_MAX,
             "sgemm_fp8_bt: size beyond 32-bit BLAS indices (m=%d n=%d k=%d)", m, n, k);
  if (m == 0 || n == 0) return;
  if (k == 0) {  // b is not read: sgemm's handling of c (beta = 0 writes zeros)
    return sgemm(false, true, m, n, 0, 1.0f, a, lda, nullptr, ldb, beta, c, ldc);
  }
  // Every row count widens panels (the dequantization is a table lookup and a product per weight,
  // too much to redo in registers for each tile of rows): the values are the dequantized matrix's,
  // f32(q) * scale_inv[row / 128, col / 128] as one f32 product, so the products that follow are
  // the f32 kernel's on that matrix.
  const float* lut = f8e4m3_table();
  widened_bt(m, n, k, a, lda, beta, c, ldc, [&](int64_t j0, int64_t rows, float* dst) {
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* src = b + (j0 + r) * ldb;
      const float* srow = scale_inv + (j0 + r) / kFp8BlockSize * ld_scale;
      float* out = dst + r * k;
      for (int64_t l0 = 0; l0 < k; l0 += kFp8BlockSize) {
        const float s = srow[l0 / kFp8BlockSize];
        const int64_t l1 = std::min(k, l0 + kFp8BlockSize);
        for (int64_t l = l0; l < l1; ++l) out[l] = lut[src[l]] * s;
      }
    }
  });
}

void sgemm_weight(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const void* w,
                  DType w_dtype, int64_t ldw, float beta, float* c, int64_t ldc,
                  const float* w_scale_inv) {
  if (w_dtype == DType::kBF16) {
    return sgemm_bf16_bt(m, n, k, a, lda, static_cast<const uint16_t*>(w), ldw, beta, c, ldc);
  }
  if (w_dtype == DType::kF8E4M3) {
    LOOM_CHECK(w_scale_inv != nullptr, "sgemm_weight: fp8 weights without their scales");
    return sgemm_fp8_bt(m, n, k, a, lda, static_cast<const uint8_t*>(w), ldw, w_scale_inv,
                        (k + kFp8BlockSize - 1) / kFp8BlockSize, beta, c, ldc);
  }
  LOOM_CHECK(w_dtype == DType::kF32, "sgemm_weight: %s weights",
             std::string(dtype_name(w_dtype)).c_str());
  sgemm(false, true, m, n, k, 1.0f, a, lda, static_cast<const float*>(w), ldw, beta, c, ldc);
}

// Contracts: kernels/gemm.cc.
void linear_forward(const Tensor& x, const Tensor& w, const Tensor& out, float beta) {
  const int64_t n = w.dim(0);
  const int64_t k = w.dim(1);
  const int64_t m = k > 0 ? x.numel() / k : out.numel() / (n > 0 ? n : 1);
  const float* scales = w.dtype() == DType::kF8E4M3 ? fp8_matrix_scales(w).data<float>() : nullptr;
  sgemm_weight(m, n, k, x.data<float>(), k, w.raw(), w.dtype(), k, beta, out.data<float>(), n,
               scales);
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

std::string blas_description() {
  const int parallel = openblas_get_parallel();  // 0 sequential, 1 pthreads, 2 OpenMP
  const char* threading = parallel == 2 ? "OpenMP" : parallel == 1 ? "pthreads" : "sequential";
  return absl::StrCat(absl::StripAsciiWhitespace(openblas_get_config()), " (", threading, ", ",
                      openblas_get_num_threads(), " threads)");
}

bool blas_uses_own_thread_pool() { return openblas_get_parallel() == 1; }

}  // namespace loom::cpu
