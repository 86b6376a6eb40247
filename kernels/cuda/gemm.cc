// CUDA GEMMs (kernels/cuda/gemm.h says which kernel runs when): cuBLAS for f32 (no TF32),
// cuBLASLt for bf16 weights, Loom's kernels (gemm_launch.h) for decode rows, awkward shapes and
// batch-invariant mode.
#include "kernels/cuda/gemm.h"

#include <cublasLt.h>
#include <cublas_v2.h>

#include <array>
#include <climits>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "kernels/cuda/device.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm_fp8.h"
#include "kernels/cuda/gemm_launch.h"

namespace loom::cuda {
namespace {

#define LOOM_CUBLAS_CHECK(call)                                                                   \
  do {                                                                                            \
    const cublasStatus_t loom_cublas_st_ = (call);                                                \
    LOOM_CHECK(loom_cublas_st_ == CUBLAS_STATUS_SUCCESS, "cuBLAS call %s failed: %s (%d)", #call, \
               cublasGetStatusString(loom_cublas_st_), static_cast<int>(loom_cublas_st_));        \
  } while (0)

// ---------------------------------------------------------------------------------------------
// f32

// Row-major out[m, n] = alpha op(a) op(b) + beta out is column-major out^T = op(b)^T op(a)^T: a
// row-major matrix with row length ld is the column-major transpose with leading dimension ld.
void sgemm_rowmajor(const Exec& ex, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                    float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                    float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // out = beta * out, and beta = 0 must not read out
    LOOM_CHECK(ldc == n, "sgemm (CUDA): strided out with k = 0");
    launch::fill_or_scale(stream_of(ex), c, m * n, beta);
    return;
  }
  if (ex.batch_invariant) {
    // Loom's kernel: one in-order FMA chain over k per element whatever m is (gemm_invariant.cu).
    launch::sgemm_invariant(stream_of(ex), trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta,
                            c, ldc);
    return;
  }
  LOOM_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX &&
                 ldc <= INT_MAX,
             "sgemm (CUDA): size beyond 32-bit cuBLAS indices (m=%d n=%d k=%d)", m, n, k);
  if (m == 1) {
    // One row (decode): a matrix-vector product; cuBLAS's Sgemm and Sgemv reached only about
    // 2.1-2.3 TB/s on the H200 for a 4096 x 4096 weight, so linear_forward's layout (b [n, k],
    // a contiguous) uses Loom's warp-per-row kernel. Other layouts go to cublasSgemv: row-major
    // b [n, k] is the column-major k x n matrix B' with ld k (out = B'^T a), row-major b [k, n]
    // the column-major n x k matrix with ld n (out = B' a). beta = 0 never reads out.
    const int inc_a = trans_a ? static_cast<int>(lda) : 1;
    if (trans_b && inc_a == 1 && ldb == k) {
      launch::gemv_rows(stream_of(ex), b, a, c, n, k, alpha, beta);
    } else if (trans_b) {
      LOOM_CUBLAS_CHECK(cublasSgemv(device_context(ex.device.index).blas, CUBLAS_OP_T,
                                    static_cast<int>(k), static_cast<int>(n), &alpha, b,
                                    static_cast<int>(ldb), a, inc_a, &beta, c, 1));
    } else {
      LOOM_CUBLAS_CHECK(cublasSgemv(device_context(ex.device.index).blas, CUBLAS_OP_N,
                                    static_cast<int>(n), static_cast<int>(k), &alpha, b,
                                    static_cast<int>(ldb), a, inc_a, &beta, c, 1));
    }
    return;
  }
  if (ex.matmul == MatmulPrecision::kBf16) {
    // Both operands rounded once into bf16 copies, multiplied on the tensor cores with f32
    // accumulation into the f32 out (what autocast does). Not CUBLAS_COMPUTE_32F_FAST_16BF: that
    // only allows bf16, and on the H200 it gave TF32's results to the last bit (s17d).
    const int64_t rows_a = trans_a ? k : m, cols_a = trans_a ? m : k;
    const int64_t rows_b = trans_b ? n : k, cols_b = trans_b ? k : n;
    const int64_t lda16 = (cols_a + 7) / 8 * 8, ldb16 = (cols_b + 7) / 8 * 8;
    const cudaStream_t stream = stream_of(ex);
    Scratch staged(static_cast<size_t>(rows_a * lda16 + rows_b * ldb16) * sizeof(uint16_t), stream);
    uint16_t* a16 = static_cast<uint16_t*>(staged.get());
    uint16_t* b16 = a16 + rows_a * lda16;
    launch::cast_rows_f32_bf16(stream, a, lda, rows_a, cols_a, a16, lda16);
    launch::cast_rows_f32_bf16(stream, b, ldb, rows_b, cols_b, b16, ldb16);
    LOOM_CUBLAS_CHECK(
        cublasGemmEx(device_context(ex.device.index).blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                     trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                     static_cast<int>(k), &alpha, b16, CUDA_R_16BF, static_cast<int>(ldb16), a16,
                     CUDA_R_16BF, static_cast<int>(lda16), &beta, c, CUDA_R_32F,
                     static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return;
  }
  if (ex.matmul == MatmulPrecision::kTf32) {
    // The trainer's opt-in (Exec::matmul): inputs rounded to TF32 on the tensor cores, f32
    // accumulation and output, the same handle (no math-mode state to restore).
    LOOM_CUBLAS_CHECK(
        cublasGemmEx(device_context(ex.device.index).blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                     trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                     static_cast<int>(k), &alpha, b, CUDA_R_32F, static_cast<int>(ldb), a,
                     CUDA_R_32F, static_cast<int>(lda), &beta, c, CUDA_R_32F, static_cast<int>(ldc),
                     CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT));
    return;
  }
  LOOM_CUBLAS_CHECK(
      cublasSgemm(device_context(ex.device.index).blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                  trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                  static_cast<int>(k), &alpha, b, static_cast<int>(ldb), a, static_cast<int>(lda),
                  &beta, c, static_cast<int>(ldc)));
}

}  // namespace

void gemm_strided_batched(const Exec& ex, int64_t batch, int64_t m, int64_t n, int64_t k,
                          const void* a, GemmElem a_type, int64_t lda, int64_t stride_a,
                          const void* b, GemmElem b_type, int64_t ldb, int64_t stride_b,
                          bool trans_b, void* c, GemmElem c_type, int64_t ldc, int64_t stride_c) {
  if (batch == 0 || m == 0 || n == 0) return;
  LOOM_CHECK(a_type == b_type && (a_type == GemmElem::kBF16 || c_type == GemmElem::kF32),
             "gemm_strided_batched: a and b of one type, and an f32 c for f32 a and b");
  LOOM_CHECK(k > 0 && batch <= INT_MAX && m <= INT_MAX && n <= INT_MAX && k <= INT_MAX &&
                 lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX,
             "gemm_strided_batched: sizes beyond 32-bit cuBLAS indices or k = 0 (batch %lld m "
             "%lld n %lld k %lld)",
             static_cast<long long>(batch), static_cast<long long>(m), static_cast<long long>(n),
             static_cast<long long>(k));
  auto type = [](GemmElem e) { return e == GemmElem::kBF16 ? CUDA_R_16BF : CUDA_R_32F; };
  const float alpha = 1.0f, beta = 0.0f;
  // Row-major c = a op(b) is column-major c^T = op(b)^T a^T, b the first operand. Read
  // column-major, a row-major b [k, n] already is op(b)^T = b^T (CUBLAS_OP_N); a row-major b
  // [n, k] (trans_b) reads as b^T [k, n], so op(b)^T = b takes CUBLAS_OP_T.
  LOOM_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      device_context(ex.device.index).blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N,
      static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b, type(b_type),
      static_cast<int>(ldb), stride_b, a, type(a_type), static_cast<int>(lda), stride_a, &beta, c,
      type(c_type), static_cast<int>(ldc), stride_c, static_cast<int>(batch), CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT));
}

namespace {

// ---------------------------------------------------------------------------------------------
// cuBLASLt (bf16)

#define LOOM_CUBLASLT_CHECK(call) LOOM_CUBLAS_CHECK(call)

constexpr int kMaxDevices = 64;
// What cuBLAS asks of Hopper for its largest kernels (cuBLAS docs: 32 MiB for sm_90).
constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;

// The largest power of two (at most 256) that divides the address.
uint32_t alignment_of(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && v % a != 0) a >>= 1;
  return a;
}
// The alignment every row of a matrix keeps: of its base and of its row stride in bytes.
uint32_t row_alignment(const void* p, int64_t ld, int64_t elem_bytes) {
  uint32_t a = alignment_of(p);
  while (a > 1 && (ld * elem_bytes) % a != 0) a >>= 1;
  return a;
}

// One shape's cuBLASLt descriptors and the heuristic's algorithm (ok = false: cuBLASLt offered
// none). Row-major out[m, n] = x[m, k] w[n, k]^T is column-major out^T (n x m, ld n) =
// W^T X with W = w as a k x n column-major matrix (ld k, transposed) and X = x as k x m (ld ldx).
struct LtPlan {
  bool ok = false;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~LtPlan() {
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

struct LtKey {
  int device;
  int64_t m, n, k, ldx;
  cudaDataType_t out_type;
  uint32_t align_w, align_x, align_out;
  size_t workspace;
  bool operator==(const LtKey&) const = default;
};
struct LtKeyHash {
  size_t operator()(const LtKey& key) const {
    size_t h = std::hash<int64_t>{}(key.m);
    auto mix = [&h](uint64_t v) {
      h ^= std::hash<uint64_t>{}(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    };
    mix(key.n), mix(key.k), mix(key.ldx), mix(static_cast<uint64_t>(key.device));
    mix(static_cast<uint64_t>(key.out_type)), mix(key.align_w), mix(key.align_x);
    mix(key.align_out), mix(key.workspace);
    return h;
  }
};

std::unique_ptr<LtPlan> make_lt_plan(cublasLtHandle_t lt, const LtKey& key) {
  auto plan = std::make_unique<LtPlan>();
  LOOM_CUBLASLT_CHECK(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  LOOM_CUBLASLT_CHECK(
      cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  LOOM_CUBLASLT_CHECK(
      cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  LOOM_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16BF, key.k, key.n, key.k));
  LOOM_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_16BF, key.k, key.m, key.ldx));
  LOOM_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&plan->c, key.out_type, key.n, key.m, key.n));

  cublasLtMatmulPreference_t pref = nullptr;
  LOOM_CUBLASLT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = key.workspace;
  LOOM_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  // The heuristic assumes 256-byte aligned pointers unless told otherwise.
  const std::array<std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t>, 4> aligns = {{
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_w},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_x},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_out},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_out},
  }};
  for (const auto& [attr, value] : aligns) {
    LOOM_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, plan->op, plan->a, plan->b, plan->c,
                                                           plan->c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
    plan->ok = true;
    plan->algo = result.algo;
  }
  return plan;
}

// Plans by shape, kept for the process (the heuristic costs more than a small matmul). At most
// kMaxPlans are kept; past that a plan serves one call and is dropped.
constexpr size_t kMaxPlans = 4096;
struct LtPlanCache {
  std::mutex mu;
  std::unordered_map<LtKey, std::unique_ptr<LtPlan>, LtKeyHash> plans;  // guarded by mu
};
LtPlanCache& lt_plans() {
  static LtPlanCache* cache = new LtPlanCache;  // never destroyed, like the contexts
  return *cache;
}

// out = x w^T (+ beta out) through cuBLASLt; x bf16 [m, k] (row stride ldx), w bf16 [n, k]. False
// (nothing enqueued) when cuBLASLt cannot take these rows.
bool lt_linear(const Exec& ex, const uint16_t* x, int64_t ldx, const uint16_t* w, void* out,
               launch::Elem out_type, int64_t m, int64_t n, int64_t k, float beta) {
  // cuBLASLt's bf16 kernels read 16-byte rows; k and ldx % 8 keep every row of w and x aligned.
  if (k % 8 != 0 || ldx % 8 != 0 || alignment_of(w) < 16 || alignment_of(x) < 16) return false;
  if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX) return false;
  const int device = ex.device.index;
  const cudaStream_t stream = stream_of(ex);
  const BlasLtContext& lt = blas_lt_context(device);
  // The workspace belongs to the context's stream: a matmul on another stream gets none.
  const bool own_stream = stream == device_context(device).stream;
  const LtKey key{device,
                  m,
                  n,
                  k,
                  ldx,
                  out_type == launch::Elem::kF32 ? CUDA_R_32F : CUDA_R_16BF,
                  row_alignment(w, k, 2),
                  row_alignment(x, ldx, 2),
                  row_alignment(out, n, out_type == launch::Elem::kF32 ? 4 : 2),
                  own_stream ? lt.workspace_bytes : 0};
  std::unique_ptr<LtPlan> once;  // a plan past the cache's capacity
  const LtPlan* plan = nullptr;
  {
    LtPlanCache& cache = lt_plans();
    std::lock_guard<std::mutex> lock(cache.mu);
    auto it = cache.plans.find(key);
    if (it != cache.plans.end()) {
      plan = it->second.get();
    } else if (cache.plans.size() < kMaxPlans) {
      plan = cache.plans.emplace(key, make_lt_plan(lt.handle, key)).first->second.get();
    }
  }
  if (plan == nullptr) {
    once = make_lt_plan(lt.handle, key);
    plan = once.get();
  }
  if (!plan->ok) return false;
  const float alpha = 1.0f;
  LOOM_CUBLASLT_CHECK(cublasLtMatmul(lt.handle, plan->op, &alpha, w, plan->a, x, plan->b, &beta,
                                     out, plan->c, out, plan->c, &plan->algo,
                                     own_stream ? lt.workspace : nullptr, key.workspace, stream));
  return true;
}

// ---------------------------------------------------------------------------------------------
// bf16 weights

launch::Elem elem_of(const Tensor& t) {
  return t.dtype() == DType::kBF16 ? launch::Elem::kBF16 : launch::Elem::kF32;
}

void check_linear(const char* fn, const Tensor& x, const Tensor& w, const Tensor& out) {
  LOOM_CHECK_CUDA_ARG(fn, x);
  LOOM_CHECK_CUDA_ARG(fn, w);
  LOOM_CHECK_CUDA_ARG(fn, out);
  auto f32_or_bf16 = [](const Tensor& t) {
    return (t.dtype() == DType::kF32 || t.dtype() == DType::kBF16) && t.is_contiguous();
  };
  LOOM_CHECK(f32_or_bf16(x) && f32_or_bf16(w) && f32_or_bf16(out) &&
                 (w.dtype() == DType::kBF16 || out.dtype() == DType::kF32),
             "%s: x %s w %s out %s: expected contiguous f32 w with f32 or bf16 x and f32 out, or a "
             "bf16 w with f32 or bf16 x and out",
             fn, x.describe().c_str(), w.describe().c_str(), out.describe().c_str());
  LOOM_CHECK(w.ndim() == 2 && x.ndim() >= 1 && out.ndim() == x.ndim() && x.dim(-1) == w.dim(1) &&
                 out.dim(-1) == w.dim(0),
             "%s: x %s w %s out %s", fn, x.describe().c_str(), w.describe().c_str(),
             out.describe().c_str());
  for (int i = 0; i + 1 < x.ndim(); ++i) {
    LOOM_CHECK(x.dim(i) == out.dim(i), "%s: x %s vs out %s", fn, x.describe().c_str(),
               out.describe().c_str());
  }
}

int64_t rows_of(const Tensor& x, const Tensor& out, int64_t n, int64_t k) {
  return k > 0 ? x.numel() / k : out.numel() / (n > 0 ? n : 1);
}

}  // namespace

bool linear_swiglu_gemv_applies(const Exec& ex, const Tensor& x, const Tensor& w_gate,
                                const Tensor& w_up, const Tensor& h) {
  if (ex.batch_invariant || w_gate.dtype() != DType::kBF16 || w_up.dtype() != DType::kBF16 ||
      w_gate.ndim() != 2 || w_up.shape() != w_gate.shape() || !w_gate.is_contiguous() ||
      !w_up.is_contiguous() || !x.is_contiguous() || !h.is_contiguous() || x.ndim() < 1 ||
      h.ndim() != x.ndim() || (x.dtype() != DType::kF32 && x.dtype() != DType::kBF16) ||
      (h.dtype() != DType::kF32 && h.dtype() != DType::kBF16)) {
    return false;
  }
  // The fused kernel vectorises both matrices or neither: equal alignment keeps each half on the
  // path (and so the bits) a separate GEMV would take.
  const auto aligned = [](const Tensor& t) {
    return (reinterpret_cast<uintptr_t>(t.raw()) & 15u) == 0;
  };
  if (aligned(w_gate) != aligned(w_up)) return false;
  const int64_t n = w_gate.dim(0), k = w_gate.dim(1);
  if (k == 0 || x.dim(-1) != k || h.dim(-1) != n ||
      x.numel() / k != h.numel() / std::max<int64_t>(n, 1))
    return false;
  return x.numel() / k <= kGemvAutoRows;
}

bool linear_swiglu_gemv(const Exec& ex, const Tensor& x, const Tensor& w_gate, const Tensor& w_up,
                        const Tensor& h) {
  if (!linear_swiglu_gemv_applies(ex, x, w_gate, w_up, h)) return false;
  const int64_t n = w_gate.dim(0), k = w_gate.dim(1), m = x.numel() / k;
  LOOM_CHECK_CUDA_ARG("linear_swiglu_forward", x);
  LOOM_CHECK_CUDA_ARG("linear_swiglu_forward", w_gate);
  LOOM_CHECK_CUDA_ARG("linear_swiglu_forward", w_up);
  LOOM_CHECK_CUDA_ARG("linear_swiglu_forward", h);
  launch::gemv_bf16_swiglu(stream_of(ex), static_cast<const uint16_t*>(w_gate.raw()),
                           static_cast<const uint16_t*>(w_up.raw()), x.raw(), elem_of(x), k,
                           h.raw(), elem_of(h), n, m, n, k);
  return true;
}

namespace {

void linear_bf16(const Exec& ex, const Tensor& x, const Tensor& w, const Tensor& out, float beta,
                 Bf16Gemm kernel) {
  const int64_t n = w.dim(0), k = w.dim(1);
  const int64_t m = rows_of(x, out, n, k);
  if (m == 0 || n == 0) return;
  const cudaStream_t stream = stream_of(ex);
  const auto* wb = static_cast<const uint16_t*>(w.raw());
  const bool forced = kernel != Bf16Gemm::kAuto;
  if (kernel == Bf16Gemm::kAuto) {
    kernel = ex.batch_invariant   ? Bf16Gemm::kTiled
             : m <= kGemvAutoRows ? Bf16Gemm::kGemv
                                  : Bf16Gemm::kCublasLt;
  }
  if (kernel == Bf16Gemm::kGemv) {
    LOOM_CHECK(m <= launch::kGemvBf16MaxRows, "linear_forward (CUDA GEMV): %lld rows, at most %d",
               static_cast<long long>(m), launch::kGemvBf16MaxRows);
    launch::gemv_bf16(stream, wb, x.raw(), elem_of(x), k, out.raw(), elem_of(out), n, m, n, k,
                      beta);
    return;
  }
  // The tensor-core paths read bf16 rows: x itself, or x rounded into the workspace (rows padded
  // with zeros to a multiple of 8 columns, so that they are 16-byte aligned).
  std::optional<Workspace::Mark> mark;
  const uint16_t* xb = static_cast<const uint16_t*>(x.raw());
  int64_t ldx = k;
  Tensor staged;
  if (x.dtype() == DType::kF32) {
    ldx = (k + 7) / 8 * 8;
    if (ex.workspace != nullptr) {
      mark.emplace(*ex.workspace);
      staged = ex.workspace->take({m, ldx}, DType::kBF16);
    } else {
      staged = Tensor::empty({m, ldx}, DType::kBF16, ex.device);
    }
    launch::cast_rows_f32_bf16(stream, x.data<float>(), k, m, k, staged.data<uint16_t>(), ldx);
    xb = staged.data<uint16_t>();
  }
  if (kernel == Bf16Gemm::kCublasLt && k > 0) {
    const bool done = lt_linear(ex, xb, ldx, wb, out.raw(), elem_of(out), m, n, k, beta);
    if (done) return;
    LOOM_CHECK(!forced,
               "linear_forward_bf16: cuBLASLt cannot take x rows %lld (row stride %lld) x w %s "
               "(16-byte aligned rows needed, or no algorithm)",
               static_cast<long long>(m), static_cast<long long>(ldx), w.describe().c_str());
  }
  launch::gemm_bf16_tiled(stream, xb, ldx, wb, out.raw(), elem_of(out), m, n, k, beta);
}

}  // namespace

const BlasLtContext& blas_lt_context(int index) {
  const DeviceContext& dc = device_context(index);  // validates the index
  static std::array<std::once_flag, kMaxDevices> once;
  static std::array<BlasLtContext, kMaxDevices> contexts;
  LOOM_CHECK(index < kMaxDevices, "CUDA device %d: too many devices", index);
  std::call_once(once[index], [index, &dc] {
    (void)dc;
    const DeviceGuard on(index);
    BlasLtContext& c = contexts[index];
    LOOM_CUBLASLT_CHECK(cublasLtCreate(&c.handle));
    LOOM_CUDA_CHECK(cudaMalloc(&c.workspace, kLtWorkspaceBytes));
    c.workspace_bytes = kLtWorkspaceBytes;
  });
  return contexts[index];
}

void linear_forward(const Exec& ex, const Tensor& x, const Tensor& w, const Tensor& out,
                    float beta) {
  if (w.dtype() == DType::kF8E4M3) {  // a stored FP8 matrix (kernels/cuda/gemm_fp8.h)
    linear_forward_fp8(ex, x, w, out, beta, Fp8Gemm::kAuto);
    return;
  }
  check_linear("linear_forward", x, w, out);
  if (w.dtype() == DType::kBF16) return linear_bf16(ex, x, w, out, beta, Bf16Gemm::kAuto);
  const int64_t n = w.dim(0), k = w.dim(1);
  const int64_t m = rows_of(x, out, n, k);
  if (x.dtype() == DType::kBF16) {
    // f32 w with bf16 rows (an MoE router on bf16 activations; routing decides on f32 logits):
    // one row is read widened by the GEMV, more are widened into the workspace first. Either
    // way the bits of the f32 product on the widened rows, without a separate widening kernel
    // at decode.
    if (m == 1 && !ex.batch_invariant) {
      launch::gemv_rows_bf16x(stream_of(ex), w.data<float>(), static_cast<const uint16_t*>(x.raw()),
                              out.data<float>(), n, k, 1.0f, beta);
      return;
    }
    std::optional<Workspace::Mark> mark;
    if (ex.workspace != nullptr) mark.emplace(*ex.workspace);
    const Tensor xf = ex.workspace != nullptr ? ex.workspace->take({m, k}, DType::kF32)
                                              : Tensor::empty({m, k}, DType::kF32, ex.device);
    copy_columns(ex, x.reshape({m, k}), 0, xf);
    sgemm_rowmajor(ex, false, true, m, n, k, 1.0f, xf.data<float>(), k, w.data<float>(), k, beta,
                   out.data<float>(), n);
    return;
  }
  sgemm_rowmajor(ex, false, true, m, n, k, 1.0f, x.data<float>(), k, w.data<float>(), k, beta,
                 out.data<float>(), n);
}

void linear_forward_bf16(const Exec& ex, const Tensor& x, const Tensor& w, const Tensor& out,
                         float beta, Bf16Gemm kernel) {
  check_linear("linear_forward_bf16", x, w, out);
  LOOM_CHECK(w.dtype() == DType::kBF16, "linear_forward_bf16: w %s is not bf16",
             w.describe().c_str());
  linear_bf16(ex, x, w, out, beta, kernel);
}

void matmul(const Exec& ex, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
            const Tensor& out, float alpha, float beta) {
  LOOM_CHECK_CUDA_ARG("matmul", a);
  LOOM_CHECK_CUDA_ARG("matmul", b);
  LOOM_CHECK_CUDA_ARG("matmul", out);
  LOOM_CHECK_F32(a);
  LOOM_CHECK_F32(b);
  LOOM_CHECK_F32(out);
  LOOM_CHECK(a.ndim() == 2 && b.ndim() == 2 && out.ndim() == 2, "matmul: a %s b %s out %s",
             a.describe().c_str(), b.describe().c_str(), out.describe().c_str());
  const int64_t m = trans_a ? a.dim(1) : a.dim(0);
  const int64_t k = trans_a ? a.dim(0) : a.dim(1);
  const int64_t kb = trans_b ? b.dim(1) : b.dim(0);
  const int64_t n = trans_b ? b.dim(0) : b.dim(1);
  LOOM_CHECK(k == kb && out.dim(0) == m && out.dim(1) == n, "matmul: a %s%s b %s%s out %s",
             a.describe().c_str(), trans_a ? "^T" : "", b.describe().c_str(), trans_b ? "^T" : "",
             out.describe().c_str());
  sgemm_rowmajor(ex, trans_a, trans_b, m, n, k, alpha, a.data<float>(), a.dim(1), b.data<float>(),
                 b.dim(1), beta, out.data<float>(), n);
}

}  // namespace loom::cuda
