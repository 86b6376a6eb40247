// Device checks for the CUDA backend, with no CUDA header.
#pragma once

#include <initializer_list>

#include "core/tensor.h"

namespace loom::cuda {

// Aborts unless `t` is a CUDA tensor (every argument of a CUDA kernel must be; the dispatchers
// check the Exec's device first, this guards direct callers of the cuda:: twins).
void check_on_device(const char* fn, const char* arg, const Tensor& t);
#define LOOM_CHECK_CUDA_ARG(fn, t) ::loom::cuda::check_on_device(fn, #t, t)

}  // namespace loom::cuda
