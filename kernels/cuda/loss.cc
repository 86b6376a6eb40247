// Host side of the CUDA fused cross-entropy (kernels/cuda/loss.h): the target check, the chunk
// loop, the GEMMs (cuda::matmul, never the loom:: dispatchers: loom_kernels links this library)
// and the row kernels of loss.cu.
#include "kernels/cuda/loss.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <optional>
#include <vector>

#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/loss_launch.h"

namespace loom::cuda {
namespace {

constexpr const char* kOp = "cross_entropy_forward_backward";

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
size_t align_up(size_t n) { return (n + 255) / 256 * 256; }

// The call's device temporaries in one buffer: ex.workspace (given back when this dies) or a
// stream-ordered allocation (freed in stream order after the launches).
class CallBuffer {
 public:
  CallBuffer(const Exec& ex, size_t bytes) {
    if (ex.workspace != nullptr) {
      mark_.emplace(*ex.workspace);
      t_ = ex.workspace->take({static_cast<int64_t>(bytes)}, DType::kU8);
      ptr_ = static_cast<char*>(t_.raw());
    } else {
      scratch_.emplace(bytes, stream_of(ex));
      ptr_ = static_cast<char*>(scratch_->get());
    }
  }
  // The next `bytes` of the buffer (256-byte aligned pieces, carved in order).
  template <typename T>
  T* carve(size_t count) {
    T* p = reinterpret_cast<T*>(ptr_ + used_);
    used_ += align_up(count * sizeof(T));
    return p;
  }

 private:
  std::optional<Workspace::Mark> mark_;
  std::optional<Scratch> scratch_;
  Tensor t_;
  char* ptr_ = nullptr;
  size_t used_ = 0;
};

// A host copy of the targets, widened to i64.
std::vector<int64_t> widen_targets(const Tensor& host) {
  std::vector<int64_t> out(static_cast<size_t>(host.numel()));
  if (host.dtype() == DType::kI64)
    std::copy_n(host.data<int64_t>(), out.size(), out.data());
  else
    std::copy_n(host.data<int32_t>(), out.size(), out.data());
  return out;
}

// The targets on the host, widened to i64 (one device-to-host copy and a synchronisation).
std::vector<int64_t> read_targets(const Exec& ex, const Tensor& targets) {
  Tensor host = Tensor::empty(targets.shape(), targets.dtype());
  download(ex, host.raw(), targets.raw(), targets.nbytes());
  return widen_targets(host);
}

}  // namespace

void cross_entropy_forward_backward(const Exec& ex, const Tensor& hidden, const Tensor& lm_head,
                                    const Tensor& targets, int64_t ignore_index, float loss_scale,
                                    const Tensor& loss, const Tensor& row_loss,
                                    const Tensor& dhidden, const Tensor& dlm_head,
                                    const Tensor& row_weight, const Tensor& host_targets) {
  LOOM_CHECK_CUDA_ARG(kOp, hidden);
  LOOM_CHECK_CUDA_ARG(kOp, lm_head);
  LOOM_CHECK_CUDA_ARG(kOp, targets);
  LOOM_CHECK_CUDA_ARG(kOp, loss);
  for (const Tensor* t : {&row_loss, &dhidden, &dlm_head, &row_weight})
    if (t->defined()) check_on_device(kOp, "optional tensor", *t);
  const int64_t t_count = hidden.dim(0), d = hidden.dim(1), v = lm_head.dim(0);
  LOOM_CHECK(t_count <= INT32_MAX, "%s (CUDA): %lld rows exceed the i32 row indices", kOp,
             static_cast<long long>(t_count));
  cudaStream_t s = stream_of(ex);
  const bool i64 = targets.dtype() == DType::kI64;

  // Validate every target before writing anything (the CPU's words); list the counted rows.
  const std::vector<int64_t> y =
      host_targets.defined() ? widen_targets(host_targets) : read_targets(ex, targets);
  std::vector<int32_t> row_of;
  row_of.reserve(y.size());
  for (int64_t t = 0; t < t_count; ++t) {
    if (y[t] == ignore_index) continue;
    LOOM_CHECK(y[t] >= 0 && y[t] < v,
               "cross_entropy_forward_backward: targets[%lld] = %lld outside [0, %lld)",
               static_cast<long long>(t), static_cast<long long>(y[t]), static_cast<long long>(v));
    row_of.push_back(static_cast<int32_t>(t));
  }
  const int64_t counted = static_cast<int64_t>(row_of.size());
  const float mean_coef = counted > 0 ? loss_scale / static_cast<float>(counted) : 0.0f;
  const bool want_grads = dhidden.defined() || dlm_head.defined();
  float* rl = row_loss.defined() ? row_loss.data<float>() : nullptr;
  float* dh = dhidden.defined() ? dhidden.data<float>() : nullptr;
  float* dw = dlm_head.defined() ? dlm_head.data<float>() : nullptr;
  const float* rw = row_weight.defined() ? row_weight.data<float>() : nullptr;
  const float* w = lm_head.data<float>();
  const Device device = hidden.device();

  // Ignored rows: zero loss, zero gradient.
  if (counted < t_count)
    launch::ce_zero_ignored(s, targets.raw(), i64, ignore_index, t_count, d, rl, dh);

  // Chunk sizes: vocabulary chunks of equal size (a multiple of 128 but the last), depending on V
  // only, so a row's log-sum-exp and dhidden sums do not depend on the other rows; row chunks of
  // equal size too (the last one possibly shorter).
  const int64_t vocab_chunks = ceil_div(v, kCeVocabChunk);
  const int64_t vc_max = std::min(v, ceil_div(ceil_div(v, vocab_chunks), 128) * 128);
  const int64_t row_chunks = std::max<int64_t>(1, ceil_div(counted, kCeRowChunk));
  const int64_t tr_max = std::max<int64_t>(1, ceil_div(counted, row_chunks));

  const size_t f = sizeof(float);
  const size_t bytes = align_up(tr_max * vc_max * f) + align_up(tr_max * d * f) +
                       (dh ? align_up(tr_max * d * f) : 0) + 5 * align_up(tr_max * f) +
                       align_up(std::max<int64_t>(counted, 1) * sizeof(double)) +
                       align_up(std::max<int64_t>(counted, 1) * sizeof(int32_t));
  CallBuffer buf(ex, bytes);
  float* logits = buf.carve<float>(tr_max * vc_max);           // [tr, vc] with row stride vc
  float* hbuf = buf.carve<float>(tr_max * d);                  // the chunk's hidden rows [tr, d]
  float* dhbuf = dh ? buf.carve<float>(tr_max * d) : nullptr;  // their gradient [tr, d]
  launch::CeRowState st;
  st.run_max = buf.carve<float>(tr_max);
  st.run_sum = buf.carve<float>(tr_max);
  st.target_logit = buf.carve<float>(tr_max);
  st.lse = buf.carve<float>(tr_max);
  st.coef = buf.carve<float>(tr_max);
  double* contrib = buf.carve<double>(std::max<int64_t>(counted, 1));  // [counted]
  int32_t* rows_dev = buf.carve<int32_t>(std::max<int64_t>(counted, 1));
  if (counted > 0)  // pageable source: staged before the call returns, so row_of may go
    LOOM_CUDA_CHECK(cudaMemcpyAsync(rows_dev, row_of.data(), counted * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, s));

  auto view = [&](const float* p, int64_t r, int64_t c) {
    return Tensor::wrap(const_cast<float*>(p), Shape{r, c}, DType::kF32, device);
  };
  for (int64_t c0 = 0; c0 < counted; c0 += tr_max) {
    const int64_t tr = std::min(tr_max, counted - c0);
    const int32_t* rows = rows_dev + c0;
    launch::CeRowState cst = st;
    cst.contrib = contrib + c0;
    launch::ce_copy_rows(s, hidden.data<float>(), rows, tr, d, false, hbuf);
    const Tensor hview = view(hbuf, tr, d);
    // Pass 1: the online log-sum-exp over the vocabulary chunks, and the targets' logits.
    for (int64_t v0 = 0; v0 < v; v0 += vc_max) {
      const int64_t vc = std::min(vc_max, v - v0);
      cuda::matmul(ex, hview, false, view(w + v0 * d, vc, d), true, view(logits, tr, vc), 1.0f,
                   0.0f);
      launch::ce_lse_chunk(s, logits, tr, vc, v0, targets.raw(), i64, rows, v0 == 0, v0 + vc >= v,
                           rw, loss_scale, mean_coef, rl, cst);
    }
    if (!want_grads) continue;
    // Pass 2: the same logits again (the same GEMM: the same bits; still in place when V is one
    // chunk), turned into dlogits, then into the two products.
    for (int64_t v0 = 0; v0 < v; v0 += vc_max) {
      const int64_t vc = std::min(vc_max, v - v0);
      const Tensor wview = view(w + v0 * d, vc, d), lview = view(logits, tr, vc);
      if (vocab_chunks > 1) cuda::matmul(ex, hview, false, wview, true, lview, 1.0f, 0.0f);
      launch::ce_dlogits_chunk(s, logits, tr, vc, v0, targets.raw(), i64, rows, st.lse, st.coef);
      // dhbuf (+)= dlogits @ lm_head[v0 : v0 + vc]
      if (dh)
        cuda::matmul(ex, lview, false, wview, false, view(dhbuf, tr, d), 1.0f,
                     v0 == 0 ? 0.0f : 1.0f);
      // dlm_head[v0 : v0 + vc] += dlogits^T @ hidden rows (cuBLAS and the batch-invariant kernel
      // both take a transposed a: no explicit transpose as on the CPU).
      if (dw) cuda::matmul(ex, lview, true, hview, false, view(dw + v0 * d, vc, d), 1.0f, 1.0f);
    }
    if (dh) launch::ce_copy_rows(s, dhbuf, rows, tr, d, true, dh);
  }
  launch::ce_loss_total(s, contrib, counted, rw != nullptr, loss.data<float>());
}

}  // namespace loom::cuda
