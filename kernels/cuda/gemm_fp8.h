// CUDA linear layers with a stored FP8 weight (core/fp8_matrix.h: e4m3 [N, K] with one f32
// scale_inv per 128 x 128 block in the same allocation), behind cuda::linear_forward
// (kernels/cuda/gemm.h). x f32 or bf16 [.., K], out f32 or bf16 [.., N], all contiguous on the
// GPU, enqueued on the Exec's stream without synchronising; beta = 0 never reads out.
//
// Kernels:
//   kGemv: Loom's GEMV (launch::gemv_fp8), the weight dequantized in registers exactly as the
//     reference (f32(q) * scale_inv, one f32 product), x used as it is, f32 accumulation: within
//     f32 rounding of the CPU twin on the dequantized matrix, reading 1 byte per weight (half of
//     bf16). Rows beyond 8 run as successive 8-row launches.
//   kBlockScaled: DeepSeek-V3's recipe. x is quantized per token and group of 128 columns
//     (launch::quantize_fp8_groups: s = amax / 448, e4m3 of x / s) into ex.workspace (or a fresh
//     buffer without one), then one cuBLASLt FP8 matmul with Hopper block scaling (cuBLAS 12.9+:
//     the weight's scales as CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, the activations' as
//     VEC128_32F; f32 compute). The activation quantization is the only difference from the
//     reference: |error| <= sum_c |w_c| (|x_c| / 16 + s_g(c) / 1024) + the GEMM's own
//     (tests/gpu/gemm_fp8_cuda_test.cc derives it; rel L2 2.5e-2 on random data). cuBLASLt needs
//     k % 16 == 0, 16-byte aligned rows of out and a multiple of 4 rows: the last m % 4 rows run
//     through the GEMV, and so do shapes it cannot take at all.
//   kDequantBf16: the weight dequantized and rounded to a bf16 matrix in ex.workspace (2 N K
//     bytes; a fresh buffer without one), then the bf16 GEMM of linear_forward_bf16 (x rounded to
//     bf16 where f32): |error| <= (2^-8 + 2^-8 [f32 x]) sum |w x| + f32 accumulation.
// kAuto: kGemv up to kFp8GemvAutoRows rows and for every row count in batch-invariant mode,
// kFp8PrefillKernel (kDequantBf16) beyond: the model's FP8 matrices are W8A16 (fixtures/README.md
// holds the FP8 fixture's GPU path to the reference's bf16 error, and DeepSeek-V3's per-128
// activation quantization, emulated in the reference, gives relative L2 0.39 to 0.52 and other
// experts on that model), so kBlockScaled (W8A8) runs only when asked for by name.
// Where it stands on an H200: decode reads half the bytes of bf16 and one row takes 0.50-0.72x
// the bf16 GEMV's time; from 9 rows on FP8 weights are slower than bf16 ones (the dequantization
// pass, or cuBLASLt's block-scaled kernels at 0.15-0.53 of its plain FP8 GEMM and 0.23-0.89 of the
// bf16 GEMM at these shapes): a Loom block-scaled wgmma kernel (DeepGEMM's design) is the next
// step (bench/results/gpu-h200.md).
#pragma once

#include "core/tensor.h"
#include "kernels/exec.h"

namespace loom::cuda {

// Which kernel runs: kAuto as above; the others force one (for tests and benchmarks). A forced
// kGemv takes any row count (in 8-row launches); a forced kBlockScaled runs every row through
// cuBLASLt or returns false (out untouched) where cuBLASLt cannot take the operands.
enum class Fp8Gemm { kAuto, kGemv, kBlockScaled, kDequantBf16 };

// Rows up to which kAuto runs the GEMV (outside batch-invariant mode), and its kernel beyond.
// H200, bf16 x and out (tests/gpu/gemm_fp8_cuda_bench.cc, bench/results/gpu-h200.md): at 8 rows
// the GEMV beats cuBLASLt's block-scaled path on all three shapes (735 vs 608 weight-GB/s at
// N 7168 K 2048, 819 vs 500 at 2048 x 7168, 380 vs 144 at 576 x 7168), at 12 rows it ties or
// loses on the first two. Beyond, the weight dequantized to bf16: activations stay bf16 (W8A16,
// above); the bf16 copy comes from the engine's workspace (2 N K bytes, sized by its measuring
// step).
inline constexpr int64_t kFp8GemvAutoRows = 8;
inline constexpr Fp8Gemm kFp8PrefillKernel = Fp8Gemm::kDequantBf16;

// out = x w^T (+ beta out) for a stored FP8 matrix w [N, K] (a whole matrix from the parameter
// arena or fp8_matrix_empty, uploaded with its scales). True when it ran (always, except a forced
// kBlockScaled that cuBLASLt refuses).
bool linear_forward_fp8(const Exec& ex, const Tensor& x, const Tensor& w, const Tensor& out,
                        float beta, Fp8Gemm kernel = Fp8Gemm::kAuto);

}  // namespace loom::cuda
