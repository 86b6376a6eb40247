// e4m3 to f32 on the device, for the kernels that dequantize stored FP8 weights in registers
// (kernels/cuda/gemm_fp8.cu, kernels/cuda/moe_fp8.cu). nvcc only.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace loom::cuda::dev {

// The two e4m3 values of the low 16 bits of `v` (element 0 in the low byte), widened exactly
// (every e4m3 value is an f16 value; the hardware converts a pair at once).
__device__ __forceinline__ float2 e4m3x2_to_f32(uint32_t v) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v & 0xffffu), __NV_E4M3);
  return __half22float2(__half2(h));
}
__device__ __forceinline__ float e4m3_to_f32(uint8_t v) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(v, __NV_E4M3)));
}

}  // namespace loom::cuda::dev
