// The formulas of kernels/random_fill.h, shared by the host fill (kernels/cpu/random_fill.cc) and
// the CUDA kernel (kernels/cuda/random_fill.cu) so that both give the same bits. No Loom or Abseil
// header: nvcc compiles it.
//
// Why these formulas: each element's value depends only on (the tensor's key, its index), through
// the SplitMix64 finaliser (a counter-based generator: any element, in any order, on any device),
// and the only floating-point step is one fused multiply-add, which IEEE rounds the same way
// everywhere (an unfused a * b + c could be contracted differently by the two compilers).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define LOOM_RANDOM_FILL_HD __host__ __device__ __forceinline__
#else
#define LOOM_RANDOM_FILL_HD inline
#endif

namespace loom::random_fill_math {

inline constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;  // SplitMix64's increment
// Uniform draws are odd multiples of half_width / 2^23: 2^23 values, symmetric about the centre.
inline constexpr int kUniformBits = 23;

LOOM_RANDOM_FILL_HD uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Element `counter` of the stream `key`: center + step * (an odd integer in (-2^23, 2^23)), where
// step = half_width / 2^23 (so the values lie strictly inside center +- half_width).
LOOM_RANDOM_FILL_HD float uniform_value(uint64_t key, uint64_t counter, float center, float step) {
  const uint64_t bits = mix64(key + (counter + 1) * kGolden);
  const int32_t s = static_cast<int32_t>(bits >> (64 - kUniformBits)) - (1 << (kUniformBits - 1));
  return fmaf(static_cast<float>(2 * s + 1), step, center);  // 2s + 1 is exact in f32
}

// Round to nearest even, as core/dtype.h's f32_to_bf16 (the values here are always finite).
LOOM_RANDOM_FILL_HD uint16_t to_bf16(float f) {
#if defined(__CUDA_ARCH__)
  uint32_t bits = __float_as_uint(f);
#else
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
#endif
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

}  // namespace loom::random_fill_math
