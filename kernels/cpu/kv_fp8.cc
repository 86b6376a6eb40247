#include "kernels/cpu/kv_fp8.h"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/dtype.h"
#include "kernels/attention.h"

namespace loom::cpu {
void kv_fp8_quantize(const float* x, int64_t n, uint8_t* dst) {
  float amax = 0.0f;
  bool finite = true;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    finite = finite && a <= std::numeric_limits<float>::max();
    amax = a > amax ? a : amax;
  }
  float scale;
  if (!finite) {
    scale = std::numeric_limits<float>::quiet_NaN();
    std::memset(dst, 0, static_cast<size_t>(n));
  } else {
    scale = amax / 448.0f;
    // An all-zero vector (or one so small that amax / 448 underflows): scale 1 and zero codes,
    // so that the vector reads back as exact zeros (signs kept).
    if (!(scale > 0.0f)) scale = 1.0f;
    const double s = scale;
    for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_f8e4m3(static_cast<double>(x[i]) / s);
  }
  std::memcpy(dst + n, &scale, kKvFp8ScaleBytes);
}

void kv_fp8_dequantize(const uint8_t* src, int64_t n, float* out) {
  float scale;
  std::memcpy(&scale, src + n, kKvFp8ScaleBytes);
  const float* lut = f8e4m3_table();
  for (int64_t i = 0; i < n; ++i) out[i] = lut[src[i]] * scale;
}

void kv_fp8_dequantize_rows(const uint8_t* src, int64_t rows, int64_t vectors, int64_t n,
                            float* out) {
  const int64_t vec_bytes = n + kKvFp8ScaleBytes;
  for (int64_t v = 0; v < rows * vectors; ++v)
    kv_fp8_dequantize(src + v * vec_bytes, n, out + v * n);
}

}  // namespace loom::cpu
