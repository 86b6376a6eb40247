#include "core/dtype.h"

#include <array>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace loom {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
      return 2;
    case DType::kF16:
      return 2;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kU8:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
      return 1;
  }
  return 0;
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kU8:
      return "u8";
    case DType::kF8E4M3:
      return "f8e4m3";
    case DType::kF8E5M2:
      return "f8e5m2";
  }
  return "?";
}

absl::StatusOr<DType> dtype_from_safetensors(std::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "BF16") return DType::kBF16;
  if (name == "F16") return DType::kF16;
  if (name == "I32") return DType::kI32;
  if (name == "I64") return DType::kI64;
  if (name == "U8") return DType::kU8;
  if (name == "F8_E4M3") return DType::kF8E4M3;
  if (name == "F8_E5M2") return DType::kF8E5M2;
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported safetensors dtype '", absl_sv(name), "'"));
}

std::string_view dtype_to_safetensors(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
    case DType::kU8:
      return "U8";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kF8E5M2:
      return "F8_E5M2";
  }
  return "?";
}

float f8e4m3_to_f32(uint8_t v) {
  const float sign = (v & 0x80) ? -1.0f : 1.0f;
  const int exp = (v >> 3) & 0xF, man = v & 0x7;
  if (exp == 0xF && man == 0x7) return std::numeric_limits<float>::quiet_NaN();
  if (exp == 0) return sign * std::ldexp(static_cast<float>(man), -9);  // subnormal: man/8 * 2^-6
  return sign * std::ldexp(1.0f + static_cast<float>(man) / 8.0f, exp - 7);
}

const float* f8e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t;
    for (int i = 0; i < 256; ++i) t[i] = f8e4m3_to_f32(static_cast<uint8_t>(i));
    return t;
  }();
  return table.data();
}

float f8e5m2_to_f32(uint8_t v) {
  const float sign = (v & 0x80) ? -1.0f : 1.0f;
  const int exp = (v >> 2) & 0x1F, man = v & 0x3;
  if (exp == 0x1F)
    return man == 0 ? sign * std::numeric_limits<float>::infinity()
                    : std::numeric_limits<float>::quiet_NaN();
  if (exp == 0) return sign * std::ldexp(static_cast<float>(man), -16);  // man/4 * 2^-14
  return sign * std::ldexp(1.0f + static_cast<float>(man) / 4.0f, exp - 15);
}

std::string device_name(Device device) {
  return device.is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(device.index);
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // overflow to inf (>= 65520 rounds to inf)
  if (abs < 0x38800000u) {                        // subnormal or zero in f16
    if (abs < 0x33000000u) return sign;           // rounds to zero
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t s = 126 - exp;  // value = mant * 2^(exp-150) = r * 2^-24
    uint32_t r = mant >> s;
    const uint32_t rem = mant & ((1u << s) - 1);
    const uint32_t mid = 1u << (s - 1);
    if (rem > mid || (rem == mid && (r & 1u))) ++r;
    return sign | static_cast<uint16_t>(r);
  }
  uint32_t r = abs - 0x38000000u;  // rebias exponent by (127 - 15) << 23
  r += 0xfffu + ((r >> 13) & 1u);  // round to nearest even
  return sign | static_cast<uint16_t>(r >> 13);
}

uint8_t f32_to_f8e4m3(double x) {
  LOOM_CHECK(!std::isnan(x), "f32_to_f8e4m3 of NaN");
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::fabs(x);
  if (a >= 448.0) return sign | 0x7E;  // saturate: 448 is S.1111.110
  int e = 0;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1): the binade's exponent is e - 1
  // Below 2^-6 (the smallest normal) the spacing is the subnormals' 2^-9; above, 2^(exp - 3).
  const double quantum = a < 0x1p-6 ? 0x1p-9 : std::ldexp(1.0, e - 1 - 3);
  const double v = std::nearbyint(a / quantum) * quantum;  // ties to even (default rounding)
  if (v < 0x1p-6) return sign | static_cast<uint8_t>(v / 0x1p-9);  // subnormal codes 0..7
  std::frexp(v, &e);  // v may have rounded up into the next binade
  const int exp = e - 1;
  const int mant = static_cast<int>(v / std::ldexp(1.0, exp - 3)) - 8;
  return sign | static_cast<uint8_t>(((exp + 7) << 3) | mant);
}

}  // namespace loom
