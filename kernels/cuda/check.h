// Device checks for the CUDA backend, with no CUDA header: the dispatch files (kernels/*.cc) call
// check_same_device before choosing a backend, so a mix of host and GPU tensors aborts with a
// clear message instead of a kernel dereferencing the wrong kind of pointer.
#pragma once

#include <initializer_list>

#include "core/tensor.h"

namespace loom::cuda {

// Aborts unless every defined tensor in `args` is on the device of the first one. `names` is the
// comma-separated argument list as written (for the message), e.g. "x, w, out".
void check_same_device(const char* fn, const char* names,
                       std::initializer_list<const Tensor*> args);
#define LOOM_CHECK_SAME_DEVICE(fn, ...) \
  ::loom::cuda::check_same_device(fn, #__VA_ARGS__, {LOOM_CUDA_ADDR_OF(__VA_ARGS__)})

// Aborts unless `t` is a CUDA tensor (every argument of a CUDA kernel must be).
void check_on_device(const char* fn, const char* arg, const Tensor& t);
#define LOOM_CHECK_CUDA_ARG(fn, t) ::loom::cuda::check_on_device(fn, #t, t)

}  // namespace loom::cuda

// &a, &b, ... for up to 8 arguments.
#define LOOM_CUDA_ADDR_1(a) &(a)
#define LOOM_CUDA_ADDR_2(a, ...) &(a), LOOM_CUDA_ADDR_1(__VA_ARGS__)
#define LOOM_CUDA_ADDR_3(a, ...) &(a), LOOM_CUDA_ADDR_2(__VA_ARGS__)
#define LOOM_CUDA_ADDR_4(a, ...) &(a), LOOM_CUDA_ADDR_3(__VA_ARGS__)
#define LOOM_CUDA_ADDR_5(a, ...) &(a), LOOM_CUDA_ADDR_4(__VA_ARGS__)
#define LOOM_CUDA_ADDR_6(a, ...) &(a), LOOM_CUDA_ADDR_5(__VA_ARGS__)
#define LOOM_CUDA_ADDR_7(a, ...) &(a), LOOM_CUDA_ADDR_6(__VA_ARGS__)
#define LOOM_CUDA_ADDR_8(a, ...) &(a), LOOM_CUDA_ADDR_7(__VA_ARGS__)
#define LOOM_CUDA_NARG_(_1, _2, _3, _4, _5, _6, _7, _8, n, ...) n
#define LOOM_CUDA_NARG(...) LOOM_CUDA_NARG_(__VA_ARGS__, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define LOOM_CUDA_ADDR_OF(...) \
  LOOM_CONCAT(LOOM_CUDA_ADDR_, LOOM_CUDA_NARG(__VA_ARGS__))(__VA_ARGS__)
