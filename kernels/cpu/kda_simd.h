// Eight-wide SIMD helpers shared by the chunked KDA forward (kda.cc) and backward
// (kda_chunked_backward.cc): GCC/Clang vector types, a branch-free exp, exponentials of f64
// exponent differences to f32 accuracy, and a small register-blocked GEMM. Internal to the CPU
// KDA kernels.
#pragma once

// The 8-wide vector helpers are inlined; without AVX GCC warns that their ABI would differ, which
// is irrelevant here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

#include <bit>
#include <cstdint>
#include <cstring>

namespace loom::cpu::kda_simd {

// Eight-wide float vectors (GCC/Clang vector extensions: portable, lowered to AVX2 here).
using v8 = float __attribute__((vector_size(32)));
using v8i = int32_t __attribute__((vector_size(32)));
using v4f = float __attribute__((vector_size(16)));
using v4d = double __attribute__((vector_size(32)));
inline v8 ld8(const float* p) {
  v8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void st8(float* p, v8 v) { std::memcpy(p, &v, sizeof(v)); }
inline v8 splat8(float x) { return v8{} + x; }
inline float hsum8(v8 v) {
  float s = 0.0f;
  for (int i = 0; i < 8; ++i) s += v[i];
  return s;
}
// exp on eight lanes, same algorithm as fexp below.
inline v8 fexp8(v8 x) {
  const v8 lo = splat8(-87.0f), hi = splat8(88.0f), magic = splat8(12582912.0f);
  v8 xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  const v8 t = xc * 1.44269504088896341f + magic;
  const v8 n = t - magic;
  const v8i ni = std::bit_cast<v8i>(t) - 0x4B400000;
  v8 r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  v8 p = splat8(1.9875691500E-4f);
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  p = p * r * r + r + 1.0f;
  const v8i si = (ni + 127) << 23;
  const v8 s = std::bit_cast<v8>(si);
  return x < lo ? v8{} : p * s;
}

// exp(x) for x in [-87, 88], ~1 ulp (Cephes expf polynomial), 0 below -87; written branch-free so
// loops calling it vectorise.
inline float fexp(float x) {
  float xc = x < -87.0f ? -87.0f : x;
  xc = xc > 88.0f ? 88.0f : xc;
  const float t = xc * 1.44269504088896341f + 12582912.0f;  // round(x / ln 2) via 1.5 * 2^23
  const float n = t - 12582912.0f;
  const int32_t ni = std::bit_cast<int32_t>(t) - 0x4B400000;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500E-4f;
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  p = p * r * r + r + 1.0f;
  const float s = std::bit_cast<float>((ni + 127) << 23);
  const float keep = x < -87.0f ? 0.0f : 1.0f;
  return p * s * keep;
}

// exp of f64 exponents (the cumulative decays and their differences, exact to f64) to f32
// accuracy. Rounding an exponent x to f32 first would cost |x| * 2^-24 of relative accuracy in
// exp(x) (5e-6 at 80 nats), and the diagonal blocks multiply such a factor e^{+x} by one near
// e^{-x}: their O(1) product would keep both errors, some 40 ulp, in the dominant entries of A and
// P. So the rounding remainder lo = x - (float)x is carried: exp(x) = exp(hi) (1 + lo) to within an
// ulp.
inline v8 exp8_split(v4d x0, v4d x1) {
  const v4f h0 = __builtin_convertvector(x0, v4f), h1 = __builtin_convertvector(x1, v4f);
  const v4f l0 = __builtin_convertvector(x0 - __builtin_convertvector(h0, v4d), v4f);
  const v4f l1 = __builtin_convertvector(x1 - __builtin_convertvector(h1, v4d), v4f);
  const v8 e = fexp8(__builtin_shufflevector(h0, h1, 0, 1, 2, 3, 4, 5, 6, 7));
  return e + e * __builtin_shufflevector(l0, l1, 0, 1, 2, 3, 4, 5, 6, 7);
}
// exp(a[i] - b[i]) for 8 doubles.
inline v8 exp_diff8(const double* a, const double* b) {
  v4d a0, a1, b0, b1;
  std::memcpy(&a0, a, sizeof(a0));
  std::memcpy(&a1, a + 4, sizeof(a1));
  std::memcpy(&b0, b, sizeof(b0));
  std::memcpy(&b1, b + 4, sizeof(b1));
  return exp8_split(a0 - b0, a1 - b1);
}
// exp(a - b[i]) for 8 doubles b.
inline v8 exp_diff8s(double a, const double* b) {
  v4d b0, b1;
  std::memcpy(&b0, b, sizeof(b0));
  std::memcpy(&b1, b + 4, sizeof(b1));
  const v4d av = v4d{} + a;
  return exp8_split(av - b0, av - b1);
}
// exp(a[i]) for 8 doubles.
inline v8 exp8d(const double* a) {
  v4d a0, a1;
  std::memcpy(&a0, a, sizeof(a0));
  std::memcpy(&a1, a + 4, sizeof(a1));
  return exp8_split(a0, a1);
}
// exp(x) of one double, as exp8_split.
inline float expd(double x) {
  const float hi = static_cast<float>(x);
  const float e = fexp(hi);
  return e + e * static_cast<float>(x - hi);
}

// ---- A small register-blocked GEMM: C[m, n] += A[m, kd] @ B[kd, n], row-major, n % 8 == 0. ----

template <int MR, int NV>
inline void gemm_tile(int64_t kd, const float* a, int64_t lda, int64_t ak, const float* b,
                      int64_t ldb, float* c, int64_t ldc) {
  v8 acc[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) acc[r][j] = ld8(c + r * ldc + 8 * j);
  for (int64_t p = 0; p < kd; ++p) {
    v8 bv[NV];
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) {
      bv[j] = ld8(b + p * ldb + 8 * j);
#if defined(__GNUC__) && defined(__AVX__)
      // Keep the B row in a register: otherwise GCC folds it into every FMA as a memory operand
      // and the kernel becomes load-bound (MR loads of B per k instead of one).
      __asm__("" : "+x"(bv[j]));
#endif
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const float av = a[r * lda + p * ak];
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) acc[r][j] += av * bv[j];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) st8(c + r * ldc + 8 * j, acc[r][j]);
}

template <int NV>
inline void gemm_cols(int64_t m, int64_t kd, const float* a, int64_t lda, int64_t ak,
                      const float* b, int64_t ldb, float* c, int64_t ldc) {
  constexpr int kMr = NV == 2 ? 6 : 8;  // 12 or 8 accumulators, 2 or 1 B registers, 1 broadcast
  int64_t i = 0;
  for (; i + kMr <= m; i += kMr)
    gemm_tile<kMr, NV>(kd, a + i * lda, lda, ak, b, ldb, c + i * ldc, ldc);
  for (; i + 4 <= m; i += 4) gemm_tile<4, NV>(kd, a + i * lda, lda, ak, b, ldb, c + i * ldc, ldc);
  switch (m - i) {
    case 3:
      gemm_tile<3, NV>(kd, a + i * lda, lda, ak, b, ldb, c + i * ldc, ldc);
      break;
    case 2:
      gemm_tile<2, NV>(kd, a + i * lda, lda, ak, b, ldb, c + i * ldc, ldc);
      break;
    case 1:
      gemm_tile<1, NV>(kd, a + i * lda, lda, ak, b, ldb, c + i * ldc, ldc);
      break;
    default:
      break;
  }
}

// Column panels outermost: one [kd, 16] panel of B (8 KiB at kd = 128) stays in L1 while every
// row block of A streams past it.
// A's element (i, p) is a[i * lda + p * ak] (ak = 1: row-major; lda = 1: a transposed view).
inline void gemm_acc(int64_t m, int64_t n, int64_t kd, const float* a, int64_t lda, int64_t ak,
                     const float* b, int64_t ldb, float* c, int64_t ldc) {
  if (kd <= 0 || m <= 0) return;
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) gemm_cols<2>(m, kd, a, lda, ak, b + j, ldb, c + j, ldc);
  for (; j < n; j += 8) gemm_cols<1>(m, kd, a, lda, ak, b + j, ldb, c + j, ldc);
}

inline int64_t round_up8(int64_t x) { return (x + 7) / 8 * 8; }

}  // namespace loom::cpu::kda_simd
