// FP8 KV vectors on the device (the format of kernels/attention.h, kKvFp8ScaleBytes): n e4m3fn
// codes then one f32 scale. The cache write encodes with kv_fp8_encode, which follows the host's
// f32_to_f8e4m3 (core/dtype.cc) step by step in double, so a GPU-written page is bit for bit a
// CPU-written one; the attention kernels widen codes with kv_fp8_word (value = f32(code) * scale,
// the host's f32 product). nvcc only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/fp8_convert.cuh"

namespace loom::cuda::dev {

// e4m3fn code of x (not NaN): the host's f32_to_f8e4m3(double) (nearest even, saturated to 448).
// The quantum is a power of two, so a / quantum is exact and rint rounds once.
__device__ __forceinline__ uint8_t kv_fp8_encode(double x) {
  const uint8_t sign = signbit(x) ? 0x80 : 0x00;
  const double a = fabs(x);
  if (a >= 448.0) return sign | 0x7E;
  int e = 0;
  frexp(a, &e);
  const double quantum = a < 0x1p-6 ? 0x1p-9 : ldexp(1.0, e - 1 - 3);
  const double v = rint(a / quantum) * quantum;
  if (v < 0x1p-6) return sign | static_cast<uint8_t>(v / 0x1p-9);
  frexp(v, &e);
  const int exp = e - 1;
  const int mant = static_cast<int>(v / ldexp(1.0, exp - 3)) - 8;
  return sign | static_cast<uint8_t>(((exp + 7) << 3) | mant);
}

// The four values of a word of four codes (element 0 in the low byte), each f32(code) * scale.
__device__ __forceinline__ float4 kv_fp8_word(uint32_t w, float scale) {
  const float2 lo = e4m3x2_to_f32(w);
  const float2 hi = e4m3x2_to_f32(w >> 16);
  return make_float4(lo.x * scale, lo.y * scale, hi.x * scale, hi.y * scale);
}

// One value of a vector.
__device__ __forceinline__ float kv_fp8_value(uint8_t code, float scale) {
  return e4m3_to_f32(code) * scale;
}

}  // namespace loom::cuda::dev
