// cuBLASLt's plain FP8 GEMM (one tensor-wide scale per operand, left at 1; e4m3 x e4m3 -> bf16,
// f32 compute): the FP8 peak the FP8 benchmarks measure in their own run (gemm_fp8_cuda_bench,
// moe_fp8_cuda_bench, at 8192^3).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/context.h"

namespace loom::fp8bench {

#define BENCH_LT_CHECK(call)                                                               \
  do {                                                                                     \
    const cublasStatus_t st_ = (call);                                                     \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                    \
      std::fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #call, (int)st_); \
      std::abort();                                                                        \
    }                                                                                      \
  } while (0)

// cuBLASLt's plain FP8 GEMM, row-major out[m, n] = x[m, k] w[n, k]^T (bf16 out), tensor-wide
// scales left at 1: what the block scaling is compared with.
struct PlainFp8 {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  PlainFp8(int64_t m, int64_t n, int64_t k) {
    BENCH_LT_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    BENCH_LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    BENCH_LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    BENCH_LT_CHECK(cublasLtMatrixLayoutCreate(&a, CUDA_R_8F_E4M3, k, n, k));
    BENCH_LT_CHECK(cublasLtMatrixLayoutCreate(&b, CUDA_R_8F_E4M3, k, m, k));
    BENCH_LT_CHECK(cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, n, m, n));
    cublasLtMatmulPreference_t pref = nullptr;
    BENCH_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = cuda::blas_lt_context(0).workspace_bytes;
    BENCH_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    cublasLtMatmulHeuristicResult_t r{};
    int found = 0;
    BENCH_LT_CHECK(cublasLtMatmulAlgoGetHeuristic(cuda::blas_lt_context(0).handle, op, a, b, c, c,
                                                  pref, 1, &r, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    if (found == 0) {
      std::fprintf(stderr, "plain FP8 cuBLASLt: no algorithm\n");
      std::abort();
    }
    algo = r.algo;
  }
  ~PlainFp8() {
    cublasLtMatrixLayoutDestroy(c);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatmulDescDestroy(op);
  }
  void run(const void* w, const void* xq, void* out, cudaStream_t stream) const {
    const float alpha = 1.0f, beta = 0.0f;
    const cuda::BlasLtContext& lt = cuda::blas_lt_context(0);
    BENCH_LT_CHECK(cublasLtMatmul(lt.handle, op, &alpha, w, a, xq, b, &beta, out, c, out, c, &algo,
                                  lt.workspace, lt.workspace_bytes, stream));
  }
};

}  // namespace loom::fp8bench
