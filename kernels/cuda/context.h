// Per-device CUDA state: the stream every Loom op on that device is enqueued on, the cuBLAS
// handle bound to it, and the cuBLASLt handle and workspace of the bf16 GEMMs. One DeviceContext
// per device index, created on first use and never destroyed (destroying streams and handles at
// exit can run after the driver has shut down). An Exec for a device carries its context's stream
// (device_exec), so ops never reach for a process-wide global.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "kernels/exec.h"

namespace loom::cuda {

struct DeviceContext {
  int index = 0;
  cudaStream_t stream = nullptr;  // a blocking stream: it also orders with the legacy stream
  cublasHandle_t blas = nullptr;  // CUBLAS_DEFAULT_MATH (true f32), host pointer mode
};

// The context of CUDA device `index` (registers the device allocator on first use).
const DeviceContext& device_context(int index);

// cuBLASLt state of device `index`, created on its first bf16 GEMM (kernels/cuda/gemm.cc) and,
// like the DeviceContext, never destroyed. The handle has no stream (each matmul names its own);
// the workspace may only be used by matmuls enqueued on the DeviceContext's stream (so that two
// never overlap): a matmul on any other stream runs with none.
struct BlasLtContext {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;  // device memory, workspace_bytes long
  size_t workspace_bytes = 0;
};
const BlasLtContext& blas_lt_context(int index);

// An execution context on CUDA device `index`, on its context's stream.
Exec device_exec(int index = 0, Workspace* workspace = nullptr);

// The stream of a CUDA Exec (aborts for a host Exec).
cudaStream_t stream_of(const Exec& ex);

// Makes `index` the calling thread's current device until destruction (restores the previous).
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace loom::cuda
