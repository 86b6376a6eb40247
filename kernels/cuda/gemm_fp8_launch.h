// Raw launchers of Loom's FP8-weight kernels (kernels/cuda/gemm_fp8.cu), behind
// kernels/cuda/gemm_fp8.cc. Like gemm_launch.h it includes no Loom or Abseil header (nvcc parses
// it); e4m3 arrays are passed as their raw bytes. Every launcher enqueues on `stream`, checks the
// launch and never synchronises. Matrices are row-major; ld* are row strides in elements.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/gemm_launch.h"

namespace loom::cuda::launch {

// out[r, j] = sum_c x[r, c] * (f32(w[j, c]) * scale_inv[j / 128, c / 128]) (+ beta out[r, j]) for
// r < m <= kGemvFp8MaxRows: the decode case of a stored FP8 weight (core/fp8_matrix.h; w [n, k]
// e4m3 with row stride k, scale_inv [ceil(n / 128), ceil(k / 128)] f32 row-major). Each weight is
// dequantized in registers exactly as the reference defines it (one f32 product), x is read as it
// is (f32 or bf16, never rounded), products and sums in f32. One block per 4 weight rows whose
// threads stride over k together (16-byte streaming loads of w when k % 16 == 0 and the pointers
// are 16-byte aligned), then a block reduction. A row's result depends only on k (the partition
// and the reduction tree), not on m, n or the other rows: batch-invariant. beta = 0 never reads
// out.
inline constexpr int kGemvFp8MaxRows = 8;
void gemv_fp8(cudaStream_t stream, const uint8_t* w, const float* scale_inv, const void* x,
              Elem x_type, int64_t ldx, void* out, Elem out_type, int64_t ldo, int64_t m, int64_t n,
              int64_t k, float beta);

// DeepSeek-V3's activation quantization, per token and group of 128 columns: for row r < m and
// group g < ceil(k / 128) (the last one partial when k % 128 != 0), s = amax(|x[r, group]|) / 448
// (1 for an all-zero group, so that zeros stay zeros rather than 0 / 0), q[r, c] = e4m3(x[r, c] /
// s) (the f32 quotient rounded to nearest even, saturated to +-448), scales[g * m + r] = s (the
// layout cuBLASLt's VEC128_32F scaling reads for an operand whose m rows are its outer dimension).
// x is [m, k] contiguous, f32 or bf16; q is [m, k] contiguous.
void quantize_fp8_groups(cudaStream_t stream, const void* x, Elem x_type, int64_t m, int64_t k,
                         uint8_t* q, float* scales);

// out[j, c] = bf16(f32(w[j, c]) * scale_inv[j / 128, c / 128]) (the dequantized weight rounded to
// nearest even bf16), out [n, k] contiguous: the FP8 weight as a bf16 matrix for the bf16 GEMM.
void dequantize_fp8_bf16(cudaStream_t stream, const uint8_t* w, const float* scale_inv, int64_t n,
                         int64_t k, uint16_t* out);

}  // namespace loom::cuda::launch
