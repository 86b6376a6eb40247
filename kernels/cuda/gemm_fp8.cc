// FP8-weight linear layers on CUDA (kernels/cuda/gemm_fp8.h says which kernel runs when): Loom's
// GEMV for decode rows, and for more rows the activations quantized per 128-column group and one
// cuBLASLt matmul with Hopper block scaling (CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F for the
// weight, VEC128_32F for the activations; cuBLAS 12.9 and later).
#include "kernels/cuda/gemm_fp8.h"

#include <cublasLt.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "core/fp8_matrix.h"
#include "core/workspace.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemm_fp8_launch.h"

namespace loom::cuda {
namespace {

#define LOOM_CUBLASLT_FP8_CHECK(call)                                                           \
  do {                                                                                          \
    const cublasStatus_t loom_lt_st_ = (call);                                                  \
    LOOM_CHECK(loom_lt_st_ == CUBLAS_STATUS_SUCCESS, "cuBLASLt call %s failed: %s (%d)", #call, \
               cublasGetStatusString(loom_lt_st_), static_cast<int>(loom_lt_st_));              \
  } while (0)

launch::Elem elem_of(const Tensor& t) {
  return t.dtype() == DType::kBF16 ? launch::Elem::kBF16 : launch::Elem::kF32;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// out[m, n] = x[m, k] w[n, k]^T (+ beta out) through the GEMV, 8 rows per launch.
void gemv_rows(const Exec& ex, const Tensor& x, const uint8_t* w, const float* scales, void* out,
               launch::Elem out_type, int64_t row0, int64_t m, int64_t n, int64_t k, float beta) {
  const int64_t x_bytes = x.dtype() == DType::kBF16 ? 2 : 4;
  const int64_t out_bytes = out_type == launch::Elem::kBF16 ? 2 : 4;
  for (int64_t r = row0; r < m; r += launch::kGemvFp8MaxRows) {
    const int64_t rows = std::min<int64_t>(launch::kGemvFp8MaxRows, m - r);
    launch::gemv_fp8(stream_of(ex), w, scales, static_cast<const char*>(x.raw()) + r * k * x_bytes,
                     elem_of(x), k, static_cast<char*>(out) + r * n * out_bytes, out_type, n, rows,
                     n, k, beta);
  }
}

// ---------------------------------------------------------------------------------------------
// cuBLASLt with block scaling. Row-major out[m, n] = x[m, k] w[n, k]^T is column-major out^T
// (n x m, ld n) = W^T X with W = w as a k x n column-major matrix (ld k, transposed, FP8 requires
// this "TN" form) and X = xq as k x m (ld k). The scale tensors: the weight's grid
// [ceil(n / 128), ceil(k / 128)] row-major with its rows padded to a multiple of 4 scales (cuBLASLt
// reads 16-byte rows of scales), and the activations' [ceil(k / 128), m] (m contiguous, m % 4 ==
// 0). The scale pointers are part of the descriptor, so a plan is made per call; the heuristic's
// algorithm is cached by shape.

struct Fp8LtKey {
  int device;
  int64_t m, n, k;
  cudaDataType_t out_type;
  size_t workspace;
  bool operator==(const Fp8LtKey&) const = default;
};
struct Fp8LtKeyHash {
  size_t operator()(const Fp8LtKey& key) const {
    size_t h = std::hash<int64_t>{}(key.m);
    auto mix = [&h](uint64_t v) {
      h ^= std::hash<uint64_t>{}(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    };
    mix(key.n), mix(key.k), mix(static_cast<uint64_t>(key.device));
    mix(static_cast<uint64_t>(key.out_type)), mix(key.workspace);
    return h;
  }
};

// The descriptors of one call (destroyed with it).
struct Fp8LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  Fp8LtDescs() = default;
  Fp8LtDescs(const Fp8LtDescs&) = delete;
  Fp8LtDescs& operator=(const Fp8LtDescs&) = delete;
  ~Fp8LtDescs() {
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

void make_descs(Fp8LtDescs& d, const Fp8LtKey& key, const float* w_scales, const float* x_scales) {
  LOOM_CUBLASLT_FP8_CHECK(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  LOOM_CUBLASLT_FP8_CHECK(
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  LOOM_CUBLASLT_FP8_CHECK(
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  const cublasLtMatmulMatrixScale_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  const cublasLtMatmulMatrixScale_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  LOOM_CUBLASLT_FP8_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                                                         &a_mode, sizeof(a_mode)));
  LOOM_CUBLASLT_FP8_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                                                         &b_mode, sizeof(b_mode)));
  LOOM_CUBLASLT_FP8_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                         &w_scales, sizeof(w_scales)));
  LOOM_CUBLASLT_FP8_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                         &x_scales, sizeof(x_scales)));
  LOOM_CUBLASLT_FP8_CHECK(cublasLtMatrixLayoutCreate(&d.a, CUDA_R_8F_E4M3, key.k, key.n, key.k));
  LOOM_CUBLASLT_FP8_CHECK(cublasLtMatrixLayoutCreate(&d.b, CUDA_R_8F_E4M3, key.k, key.m, key.k));
  LOOM_CUBLASLT_FP8_CHECK(cublasLtMatrixLayoutCreate(&d.c, key.out_type, key.n, key.m, key.n));
}

// The heuristic's algorithm for a shape (nullopt: cuBLASLt offers none), kept for the process
// (at most kMaxAlgos shapes; past that the heuristic runs per call).
constexpr size_t kMaxAlgos = 4096;
struct Fp8AlgoCache {
  std::mutex mu;
  std::unordered_map<Fp8LtKey, std::optional<cublasLtMatmulAlgo_t>, Fp8LtKeyHash>
      algos;  // guarded by mu
};
Fp8AlgoCache& fp8_algos() {
  static Fp8AlgoCache* cache = new Fp8AlgoCache;  // never destroyed, like the contexts
  return *cache;
}

std::optional<cublasLtMatmulAlgo_t> find_algo(cublasLtHandle_t lt, const Fp8LtKey& key,
                                              const Fp8LtDescs& d) {
  {
    Fp8AlgoCache& cache = fp8_algos();
    std::lock_guard<std::mutex> lock(cache.mu);
    auto it = cache.algos.find(key);
    if (it != cache.algos.end()) return it->second;
  }
  cublasLtMatmulPreference_t pref = nullptr;
  LOOM_CUBLASLT_FP8_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = key.workspace;
  LOOM_CUBLASLT_FP8_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  // Every operand is 16-byte aligned (checked by the caller), not necessarily 256.
  const uint32_t align = 16;
  for (const auto attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    LOOM_CUBLASLT_FP8_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align)));
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(lt, d.op, d.a, d.b, d.c, d.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  std::optional<cublasLtMatmulAlgo_t> algo;
  if (st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
    algo = result.algo;
  }
  Fp8AlgoCache& cache = fp8_algos();
  std::lock_guard<std::mutex> lock(cache.mu);
  if (cache.algos.size() < kMaxAlgos) cache.algos.emplace(key, algo);
  return algo;
}

// A scratch tensor from the workspace (inside the caller's Mark) or a fresh buffer.
Tensor scratch(const Exec& ex, const Shape& shape, DType dtype) {
  return ex.workspace != nullptr ? ex.workspace->take(shape, dtype)
                                 : Tensor::empty(shape, dtype, ex.device);
}

// Rows [0, m) of out through cuBLASLt (m % 4 == 0). False, with out untouched, when cuBLASLt
// cannot take the operands.
bool block_scaled_rows(const Exec& ex, const Tensor& x, const Tensor& w, void* out,
                       launch::Elem out_type, int64_t m, int64_t n, int64_t k, float beta) {
  const int64_t out_bytes = out_type == launch::Elem::kBF16 ? 2 : 4;
  // FP8 matmuls read 16-byte rows: k bytes of w and xq, n elements of out.
  if (m == 0 || m % 4 != 0 || k % 16 != 0 || (n * out_bytes) % 16 != 0) return false;
  if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX) return false;
  if (!aligned16(w.raw()) || !aligned16(out)) return false;
  const int device = ex.device.index;
  const cudaStream_t stream = stream_of(ex);
  const BlasLtContext& lt = blas_lt_context(device);
  // The workspace belongs to the context's stream: a matmul on another stream gets none.
  const bool own_stream = stream == device_context(device).stream;
  const Fp8LtKey key{device,
                     m,
                     n,
                     k,
                     out_type == launch::Elem::kF32 ? CUDA_R_32F : CUDA_R_16BF,
                     own_stream ? lt.workspace_bytes : 0};

  std::optional<Workspace::Mark> mark;
  if (ex.workspace != nullptr) mark.emplace(*ex.workspace);
  const int64_t gn = (n + kFp8BlockSize - 1) / kFp8BlockSize;
  const int64_t gk = (k + kFp8BlockSize - 1) / kFp8BlockSize;
  const Tensor w_scales = fp8_matrix_scales(w);
  const float* ws_ptr = w_scales.data<float>();
  Tensor padded;
  if (gk % 4 != 0) {
    // Rows of scales padded to 16 bytes (the pad is never applied: no k lies beyond the grid).
    const int64_t ld = (gk + 3) / 4 * 4;
    padded = scratch(ex, {gn, ld}, DType::kF32);
    LOOM_CUDA_CHECK(cudaMemsetAsync(padded.raw(), 0, padded.nbytes(), stream));
    LOOM_CUDA_CHECK(cudaMemcpy2DAsync(padded.raw(), ld * 4, ws_ptr, gk * 4, gk * 4, gn,
                                      cudaMemcpyDeviceToDevice, stream));
    ws_ptr = padded.data<float>();
  }
  const Tensor xq = scratch(ex, {m, k}, DType::kF8E4M3);
  const Tensor xs = scratch(ex, {gk, m}, DType::kF32);
  if (!aligned16(xq.raw()) || !aligned16(xs.raw()) || !aligned16(ws_ptr)) return false;

  Fp8LtDescs d;
  make_descs(d, key, ws_ptr, xs.data<float>());
  const std::optional<cublasLtMatmulAlgo_t> algo = find_algo(lt.handle, key, d);
  if (!algo) return false;
  launch::quantize_fp8_groups(stream, x.raw(), elem_of(x), m, k, static_cast<uint8_t*>(xq.raw()),
                              xs.data<float>());
  const float alpha = 1.0f;
  LOOM_CUBLASLT_FP8_CHECK(
      cublasLtMatmul(lt.handle, d.op, &alpha, w.raw(), d.a, xq.raw(), d.b, &beta, out, d.c, out,
                     d.c, &*algo, own_stream ? lt.workspace : nullptr, key.workspace, stream));
  return true;
}

// out through the weight dequantized to a bf16 matrix in the workspace and the bf16 GEMM
// (cuBLASLt, or Loom's tensor-core kernel where cuBLASLt cannot take the rows).
void dequantized_bf16_rows(const Exec& ex, const Tensor& x, const Tensor& w, const Tensor& out,
                           float beta) {
  const int64_t n = w.dim(0), k = w.dim(1);
  std::optional<Workspace::Mark> mark;
  if (ex.workspace != nullptr) mark.emplace(*ex.workspace);
  const Tensor wb = scratch(ex, {n, k}, DType::kBF16);
  launch::dequantize_fp8_bf16(stream_of(ex), static_cast<const uint8_t*>(w.raw()),
                              fp8_matrix_scales(w).data<float>(), n, k, wb.data<uint16_t>());
  linear_forward_bf16(ex, x, wb, out, beta, Bf16Gemm::kAuto);
}

}  // namespace

bool linear_forward_fp8(const Exec& ex, const Tensor& x, const Tensor& w, const Tensor& out,
                        float beta, Fp8Gemm kernel) {
  LOOM_CHECK_CUDA_ARG("linear_forward_fp8", x);
  LOOM_CHECK_CUDA_ARG("linear_forward_fp8", w);
  LOOM_CHECK_CUDA_ARG("linear_forward_fp8", out);
  auto f32_or_bf16 = [](const Tensor& t) {
    return (t.dtype() == DType::kF32 || t.dtype() == DType::kBF16) && t.is_contiguous();
  };
  LOOM_CHECK(w.dtype() == DType::kF8E4M3 && w.is_contiguous() && w.ndim() == 2 && f32_or_bf16(x) &&
                 f32_or_bf16(out),
             "linear_forward_fp8: x %s w %s out %s: expected a stored f8e4m3 w [N, K] and "
             "contiguous f32 or bf16 x and out",
             x.describe().c_str(), w.describe().c_str(), out.describe().c_str());
  LOOM_CHECK(
      x.ndim() >= 1 && out.ndim() == x.ndim() && x.dim(-1) == w.dim(1) && out.dim(-1) == w.dim(0),
      "linear_forward_fp8: x %s w %s out %s", x.describe().c_str(), w.describe().c_str(),
      out.describe().c_str());
  const int64_t n = w.dim(0), k = w.dim(1);
  const int64_t m = k > 0 ? x.numel() / k : out.numel() / (n > 0 ? n : 1);
  if (m == 0 || n == 0) return true;
  const auto* wq = static_cast<const uint8_t*>(w.raw());
  const float* scales = fp8_matrix_scales(w).data<float>();
  if (kernel == Fp8Gemm::kAuto) {
    kernel = ex.batch_invariant || m <= kFp8GemvAutoRows ? Fp8Gemm::kGemv : kFp8PrefillKernel;
  } else if (kernel == Fp8Gemm::kBlockScaled) {
    // Forced: every row through cuBLASLt, or nothing.
    return block_scaled_rows(ex, x, w, out.raw(), elem_of(out), m, n, k, beta);
  }
  if (kernel == Fp8Gemm::kDequantBf16) {
    dequantized_bf16_rows(ex, x, w, out, beta);
    return true;
  }
  if (kernel == Fp8Gemm::kBlockScaled) {
    // cuBLASLt takes a multiple of 4 rows; the last m % 4 (and every row of a shape it refuses)
    // run through the GEMV.
    const int64_t lt_rows = m / 4 * 4;
    if (block_scaled_rows(ex, x, w, out.raw(), elem_of(out), lt_rows, n, k, beta)) {
      gemv_rows(ex, x, wq, scales, out.raw(), elem_of(out), lt_rows, m, n, k, beta);
      return true;
    }
  }
  gemv_rows(ex, x, wq, scales, out.raw(), elem_of(out), 0, m, n, k, beta);
  return true;
}

}  // namespace loom::cuda
