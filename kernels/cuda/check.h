// Device checks for the CUDA backend, with no CUDA header.
#pragma once

#include <initializer_list>

#include "core/tensor.h"

namespace loom::cuda {

// Aborts unless `t` is a CUDA tensor (every argument of a CUDA kernel must be; the dispatchers
// check the Exec's device first, this guards direct callers of the cuda:: twins).
void check_on_device(const char* fn, const char* arg, const Tensor& t);
#define LOOM_CHECK_CUDA_ARG(fn, t) ::loom::cuda::check_on_device(fn, #t, t)

// Whether the bytes of two (contiguous) tensors overlap.
inline bool overlaps(const Tensor& a, const Tensor& b) {
  const char* pa = static_cast<const char*>(a.raw());
  const char* pb = static_cast<const char*>(b.raw());
  return a.nbytes() > 0 && b.nbytes() > 0 && pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

}  // namespace loom::cuda

// Aborts unless `t` is contiguous f32 or bf16: the types an activation may have on the CUDA
// backend (its kernels compute in f32 and round bf16 stores to nearest even).
#define LOOM_CHECK_ACT(t)                                                                   \
  LOOM_CHECK(((t).dtype() == ::loom::DType::kF32 || (t).dtype() == ::loom::DType::kBF16) && \
                 (t).is_contiguous(),                                                       \
             "%s: expected contiguous f32 or bf16, got %s", #t, (t).describe().c_str())
// Aborts when `out` overlaps `in` with another element type: a kernel may write over its input
// only element for element, which needs both to have the same type.
#define LOOM_CHECK_ALIAS_SAME_TYPE(fn, out, in)                                       \
  LOOM_CHECK((out).dtype() == (in).dtype() || !::loom::cuda::overlaps(out, in),       \
             "%s: %s %s overlaps %s %s: in place only with the same dtype", fn, #out, \
             (out).describe().c_str(), #in, (in).describe().c_str())
