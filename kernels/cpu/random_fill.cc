#include "kernels/cpu/random_fill.h"

#include <cmath>

#include "kernels/random_fill_math.h"

namespace loom::cpu {

void random_fill(const Tensor& dst, const RandomFillParams& p) {
  const int64_t n = dst.numel();
  const float step = std::ldexp(p.half_width, -random_fill_math::kUniformBits);
  const uint64_t first = static_cast<uint64_t>(p.first);
  if (dst.dtype() == DType::kF32) {
    float* out = dst.data<float>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i)
      out[i] = random_fill_math::uniform_value(p.key, first + i, p.center, step);
  } else {
    uint16_t* out = dst.data<uint16_t>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i)
      out[i] = random_fill_math::to_bf16(
          random_fill_math::uniform_value(p.key, first + i, p.center, step));
  }
}

}  // namespace loom::cpu
