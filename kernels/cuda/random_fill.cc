// Host side of the CUDA random fill: checks, then launch on the device's own stream.
#include "kernels/cuda/random_fill.h"

#include <cmath>

#include "kernels/cuda/check.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/random_fill_launch.h"
#include "kernels/random_fill_math.h"

namespace loom::cuda {

void random_fill(const Exec& ex, const Tensor& dst, const RandomFillParams& p) {
  LOOM_CHECK_CUDA_ARG("random_fill", dst);
  const DeviceGuard on(ex.device.index);
  launch::random_fill(stream_of(ex), dst.raw(), dst.dtype() == DType::kBF16, dst.numel(), p.key,
                      static_cast<uint64_t>(p.first), p.center,
                      std::ldexp(p.half_width, -random_fill_math::kUniformBits));
}

}  // namespace loom::cuda
