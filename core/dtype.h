// Element types and devices a Tensor can hold, and conversions between the float formats.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace loom {

// kF8E4M3 / kF8E5M2: OCP FP8 storage (e4m3 "fn": no infinities, 0x7F/0xFF are NaN; e5m2 IEEE-like);
// checkpoints store block-quantized weights in them (weights/weight_loader.cc dequantizes).
enum class DType : uint8_t { kF32, kBF16, kF16, kI32, kI64, kU8, kF8E4M3, kF8E5M2 };
enum class DeviceKind : uint8_t { kCpu, kCuda };

// Where a tensor lives: the host, or one CUDA device by its runtime index. Compared by value;
// `Device::kCpu` and `Device::kCuda` (device 0) are the common constants.
struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int16_t index = 0;

  static const Device kCpu;
  static const Device kCuda;
  static constexpr Device cuda(int index) {
    return Device{DeviceKind::kCuda, static_cast<int16_t>(index)};
  }
  constexpr bool is_cpu() const { return kind == DeviceKind::kCpu; }
  constexpr bool is_cuda() const { return kind == DeviceKind::kCuda; }
  friend constexpr bool operator==(Device a, Device b) = default;
};
inline constexpr Device Device::kCpu{DeviceKind::kCpu, 0};
inline constexpr Device Device::kCuda{DeviceKind::kCuda, 0};

size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);
// Parses safetensors dtype names ("F32", "BF16", "F16", "I32", "I64", "U8", "F8_E4M3", "F8_E5M2").
absl::StatusOr<DType> dtype_from_safetensors(std::string_view name);
std::string_view dtype_to_safetensors(DType dtype);
// "cpu" or "cuda:<index>".
std::string device_name(Device device);

// bfloat16 is the upper half of an IEEE binary32; conversion to f32 is exact.
inline float bf16_to_f32(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}
// Round to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}
float f16_to_f32(uint16_t v);
uint16_t f32_to_f16(float f);
// Exact widenings of the FP8 formats (every FP8 value is an f32 value).
float f8e4m3_to_f32(uint8_t v);
// f8e4m3_to_f32 of every code, built once (0x7F and 0xFF are NaN; no quantizer writes them):
// the CPU kernels widen FP8 weights and KV pages through it.
const float* f8e4m3_table();
float f8e5m2_to_f32(uint8_t v);
// The e4m3fn code nearest to x, ties to even, saturated to +-448 (e4m3fn has no infinities, and a
// weight beyond the largest finite value is better clipped than turned into NaN); -0 and negative
// values that round to 0 keep the sign bit. x must not be NaN. Takes a double so that a quotient
// w / scale_inv is rounded once, straight to e4m3 (an f32 quotient would round twice, and could
// land on an e4m3 tie the exact quotient is not on).
uint8_t f32_to_f8e4m3(double x);

}  // namespace loom
