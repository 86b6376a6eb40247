// Device dispatch for kernels/random_fill.h.
#include "kernels/random_fill.h"

#include <cmath>

#include "kernels/cpu/random_fill.h"
#include "kernels/random_fill_math.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/random_fill.h"
#endif

namespace loom {

uint64_t random_fill_key(uint64_t seed, std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a of the name
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return random_fill_math::mix64(random_fill_math::mix64(seed) ^ h);
}

void random_fill(const Exec& ex, const Tensor& dst, const RandomFillParams& p) {
  LOOM_ON_EXEC_DEVICE(ex, "random_fill", dst);
  LOOM_CHECK(dst.is_contiguous() && (dst.dtype() == DType::kF32 || dst.dtype() == DType::kBF16),
             "random_fill into %s: contiguous f32 or bf16 only", dst.describe().c_str());
  LOOM_CHECK(
      std::isfinite(p.center) && std::isfinite(p.half_width) && p.half_width >= 0 && p.first >= 0,
      "random_fill: center %g, half width %g, first %lld", p.center, p.half_width,
      static_cast<long long>(p.first));
  if (ex.device.is_cpu()) return cpu::random_fill(dst, p);
#ifdef LOOM_WITH_CUDA
  return cuda::random_fill(ex, dst, p);
#else
  no_kernel_for(ex, "random_fill");
#endif
}

}  // namespace loom
