// Exec: where and how a kernel op runs. Every op in kernels/*.h takes one as its first argument;
// its tensors must all live on `ex.device` (checked once, at dispatch in kernels/<family>.cc,
// before the cpu:: or cuda:: twin runs).
//
// An Exec is cheap to copy and owns nothing: the CUDA stream belongs to the device's context
// (kernels/cuda/context.h, cuda::device_exec), the workspace to whoever runs the step.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "core/workspace.h"

namespace loom {

// How a GPU's f32 GEMMs of more than one row that go to cuBLAS multiply (the trainer's
// `matmul`): in f32 on the CUDA cores, or on the tensor cores with their inputs rounded to TF32
// (10-bit mantissa; cuBLAS's FAST_TF32) or to bf16 (7-bit mantissa; both operands cast into bf16
// copies first), accumulating in f32 either way. Operands and results stay f32 in memory.
enum class MatmulPrecision { kF32, kTf32, kBf16 };

struct Exec {
  Device device = Device::kCpu;
  // The device's cudaStream_t (as void*, so that this header needs no CUDA header); null on the
  // host. Every kernel, copy and BLAS call of the op is enqueued on it.
  void* stream = nullptr;
  // Temporaries of ops that need them; null: such ops allocate (tools, tests).
  Workspace* workspace = nullptr;
  // Batch-invariant numerics (kernels/batch_invariance.h): each output row is computed by the
  // same operations whatever else is in the call. The engine's --deterministic mode.
  bool batch_invariant = false;
  // The trainer's opt-in for f32 GEMMs on a GPU's tensor cores (Model::set_matmul_precision).
  // Ignored under batch_invariant, which keeps its own f32 kernel. Never other than kF32 for the
  // host: the CPU has no such unit.
  MatmulPrecision matmul = MatmulPrecision::kF32;
};

// The host, no workspace, default numerics: for tools, tests and one-off host work.
const Exec& host_exec();

// Aborts naming `op` and the offending tensor unless every defined tensor of `args` lives on
// `ex.device`: a host pointer must never reach a device kernel, nor the reverse.
void check_exec_device(const Exec& ex, const char* op, const char* names,
                       std::initializer_list<const Tensor*> args);

// "cpu", "cuda" (device 0) or "cuda:N" (flags); InvalidArgument naming the accepted forms
// otherwise. Says nothing about whether this build or machine has the device: device_available.
absl::StatusOr<Device> parse_device(std::string_view name);

// OK when ops can run on `device` here: always for the host; for a CUDA device, when this build
// has the CUDA backend and the machine shows that device. InvalidArgument saying which is missing
// otherwise, so that a --device flag is refused with a message instead of an abort. Success also
// initialises that backend (core/allocator.h's device allocator and copier), so call it before
// allocating on a device (Model::load does).
absl::Status device_available(Device device);

// A device's memory as its driver reports it now (cudaMemGetInfo): what is free and the total.
struct DeviceMemory {
  size_t free_bytes = 0;
  size_t total_bytes = 0;
};
// InvalidArgument for the host (its memory is not budgeted this way) or a device that is not
// available (device_available's message).
absl::StatusOr<DeviceMemory> device_memory(Device device);

// The Exec of `device`: the host's, or the device's own stream (kernels/cuda/context.h), with
// `workspace`. The device must be available (device_available).
Exec exec_for(Device device, Workspace* workspace = nullptr);

// Host-to-device copy of `bytes` enqueued on `ex`'s stream (a memcpy on the host). `src` is
// pageable host memory, staged before the call returns, so the caller may refill it at once;
// the device sees the bytes in stream order.
void upload_async(const Exec& ex, void* dst, const void* src, size_t bytes);
// Device-to-host copy of `bytes` on `ex`'s stream, after everything enqueued before it; the bytes
// are in `dst` when the call returns (a memcpy on the host).
void download(const Exec& ex, void* dst, const void* src, size_t bytes);

// Device-to-host copy of `bytes` enqueued on `ex`'s stream, after everything enqueued before it,
// without waiting: `dst` holds the bytes once synchronize(ex) returns (at once on the host, a
// memcpy). On a GPU `dst` must be page-locked (core/allocator.h's allocate_transfer_buffer), or
// the copy is staged and synchronous.
void download_async(const Exec& ex, void* dst, const void* src, size_t bytes);
// Many copies between host memory and ex.device's, all one way, enqueued on `ex`'s stream after
// everything enqueued before them without waiting: dsts[i] gets sizes[i] bytes from srcs[i] (a
// memcpy each on the host). On a GPU one cudaMemcpyBatchAsync per up to 16384 copies: a
// session's cache is thousands of pages, and a cudaMemcpyAsync each cost ~25 us of driver time
// (bench/results/gpu-h200.md). The host side must be page-locked (allocate_transfer_buffer); the
// copies read their sources in stream order, and their results are there once synchronize(ex)
// returns.
void copy_batch_async(const Exec& ex, void* const* dsts, const void* const* srcs,
                      const size_t* sizes, size_t n);
// Copy of `bytes` between two buffers on ex.device, enqueued on `ex`'s stream after everything
// enqueued before it (a memcpy on the host): no allocation, no synchronisation.
void copy_async(const Exec& ex, void* dst, const void* src, size_t bytes);
// Waits until everything enqueued on `ex`'s stream has finished (nothing to wait for on the host).
void synchronize(const Exec& ex);

// Aborts: `op` has no kernel for `ex.device` in this build (a CUDA tensor in a CPU-only build, or
// an op whose CUDA kernel does not exist yet).
[[noreturn]] void no_kernel_for(const Exec& ex, const char* op);

}  // namespace loom

// &a, &b, ... for up to 8 arguments.
#define LOOM_EXEC_ADDR_1(a) &(a)
#define LOOM_EXEC_ADDR_2(a, ...) &(a), LOOM_EXEC_ADDR_1(__VA_ARGS__)
#define LOOM_EXEC_ADDR_3(a, ...) &(a), LOOM_EXEC_ADDR_2(__VA_ARGS__)
#define LOOM_EXEC_ADDR_4(a, ...) &(a), LOOM_EXEC_ADDR_3(__VA_ARGS__)
#define LOOM_EXEC_ADDR_5(a, ...) &(a), LOOM_EXEC_ADDR_4(__VA_ARGS__)
#define LOOM_EXEC_ADDR_6(a, ...) &(a), LOOM_EXEC_ADDR_5(__VA_ARGS__)
#define LOOM_EXEC_ADDR_7(a, ...) &(a), LOOM_EXEC_ADDR_6(__VA_ARGS__)
#define LOOM_EXEC_ADDR_8(a, ...) &(a), LOOM_EXEC_ADDR_7(__VA_ARGS__)
#define LOOM_EXEC_NARG_(_1, _2, _3, _4, _5, _6, _7, _8, n, ...) n
#define LOOM_EXEC_NARG(...) LOOM_EXEC_NARG_(__VA_ARGS__, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define LOOM_EXEC_ADDR_OF(...) \
  LOOM_CONCAT(LOOM_EXEC_ADDR_, LOOM_EXEC_NARG(__VA_ARGS__))(__VA_ARGS__)

// LOOM_ON_EXEC_DEVICE(ex, "op", x, w, out): every listed tensor is on ex.device.
#define LOOM_ON_EXEC_DEVICE(ex, op, ...) \
  ::loom::check_exec_device(ex, op, #__VA_ARGS__, {LOOM_EXEC_ADDR_OF(__VA_ARGS__)})
