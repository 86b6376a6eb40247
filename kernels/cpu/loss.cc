#include "kernels/cpu/loss.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/gemm.h"

namespace loom::cpu {
namespace {

constexpr int64_t kRowChunk = 256;     // counted rows per chunk
constexpr int64_t kVocabChunk = 4096;  // vocabulary entries per logits chunk

template <typename Id>
int64_t target_of(const Tensor& targets, int64_t t) {
  return static_cast<int64_t>(targets.data<Id>()[t]);
}

int64_t target_at(const Tensor& targets, int64_t t) {
  return targets.dtype() == DType::kI32 ? target_of<int32_t>(targets, t)
                                        : target_of<int64_t>(targets, t);
}

}  // namespace

CrossEntropyScratch cross_entropy_scratch(int64_t t, int64_t v, int64_t d) {
  const int64_t tr = std::max<int64_t>(1, std::min(kRowChunk, t));
  const int64_t vc = std::min(kVocabChunk, v);
  // logits [tr, vc] | their transpose [vc, tr] | gathered hidden [tr, d] | its gradient [tr, d] |
  // max, sum, lse, target logit [4, tr].
  return {Shape{2 * tr * vc + 2 * tr * d + 4 * tr}, Shape{tr}};
}

// The method and its scratch are described in kernels/loss.h. The OpenMP loops below split the rows
// of a chunk (or the columns of a transpose) over threads, each row's work in a fixed order: they
// give the same bits whatever the thread count; the sums across rows (loss, dlm_head) run serially
// in row order or inside the GEMMs.
void cross_entropy_forward_backward(const Tensor& hidden, const Tensor& lm_head,
                                    const Tensor& targets, int64_t ignore_index, float loss_scale,
                                    const Tensor& loss, const Tensor& row_loss,
                                    const Tensor& dhidden, const Tensor& dlm_head,
                                    const Tensor& scratch, const Tensor& rows,
                                    const Tensor& row_weight) {
  const int64_t t_count = hidden.dim(0), d = hidden.dim(1), v = lm_head.dim(0);
  // Validate every target before writing anything; count the rows that take part.
  int64_t counted = 0;
  for (int64_t t = 0; t < t_count; ++t) {
    const int64_t y = target_at(targets, t);
    if (y == ignore_index) continue;
    LOOM_CHECK(y >= 0 && y < v,
               "cross_entropy_forward_backward: targets[%lld] = %lld outside [0, %lld)",
               static_cast<long long>(t), static_cast<long long>(y), static_cast<long long>(v));
    ++counted;
  }
  const bool want_grads = dhidden.defined() || dlm_head.defined();
  // Row t's dlogits factor: loss_scale / counted for the mean, loss_scale * row_weight[t] for the
  // weighted sum.
  const float* rw = row_weight.defined() ? row_weight.data<float>() : nullptr;
  const float mean_coef = counted > 0 ? loss_scale / static_cast<float>(counted) : 0.0f;
  const float* h = hidden.data<float>();
  const float* w = lm_head.data<float>();
  float* rl = row_loss.defined() ? row_loss.data<float>() : nullptr;
  float* dh = dhidden.defined() ? dhidden.data<float>() : nullptr;
  float* dw = dlm_head.defined() ? dlm_head.data<float>() : nullptr;
  // Ignored rows: zero loss, zero gradient.
  for (int64_t t = 0; t < t_count; ++t) {
    if (target_at(targets, t) != ignore_index) continue;
    if (rl) rl[t] = 0.0f;
    if (dh) std::memset(dh + t * d, 0, sizeof(float) * d);
  }

  const CrossEntropyScratch shapes = cross_entropy_scratch(t_count, v, d);
  const int64_t tr_max = shapes.rows[0];
  const int64_t vc_max = std::min(kVocabChunk, v);
  float* logits = scratch.data<float>();        // [tr, vc] with row stride vc
  float* dlogits_t = logits + tr_max * vc_max;  // [vc, tr] with row stride tr
  float* hbuf = dlogits_t + tr_max * vc_max;    // [tr, d]
  float* dhbuf = hbuf + tr_max * d;             // [tr, d]
  float* run_max = dhbuf + tr_max * d;          // [tr]
  float* run_sum = run_max + tr_max;            // [tr]
  float* lse = run_sum + tr_max;                // [tr]
  float* target_logit = lse + tr_max;           // [tr]
  std::vector<float> coef(tr_max, mean_coef);   // [tr]: the chunk rows' dlogits factors
  int64_t* row_of = rows.data<int64_t>();       // [tr]: the hidden row of chunk row i

  double loss_sum = 0.0;  // row losses in row order
  int64_t next = 0;       // the next hidden row to look at
  while (next < t_count) {
    // Gather the next up to tr_max counted rows.
    int64_t tr = 0;
    for (; next < t_count && tr < tr_max; ++next) {
      if (target_at(targets, next) == ignore_index) continue;
      row_of[tr] = next;
      std::memcpy(hbuf + tr * d, h + next * d, sizeof(float) * d);
      ++tr;
    }
    if (tr == 0) break;
    for (int64_t i = 0; i < tr; ++i) {
      run_max[i] = -std::numeric_limits<float>::infinity();
      run_sum[i] = 0.0f;
    }
    // Pass 1: an online log-sum-exp over the vocabulary chunks, and the target's logit.
    for (int64_t v0 = 0; v0 < v; v0 += vc_max) {
      const int64_t vc = std::min(vc_max, v - v0);
      sgemm(false, true, tr, vc, d, 1.0f, hbuf, d, w + v0 * d, d, 0.0f, logits, vc);
#pragma omp parallel for schedule(static) if (tr * vc > 32768)
      for (int64_t i = 0; i < tr; ++i) {
        const float* l = logits + i * vc;
        float mx = run_max[i];
        for (int64_t j = 0; j < vc; ++j) mx = std::max(mx, l[j]);
        float sum = run_sum[i] * std::exp(run_max[i] - mx);  // exp(-inf) = 0 on the first chunk
        for (int64_t j = 0; j < vc; ++j) sum += std::exp(l[j] - mx);
        run_max[i] = mx;
        run_sum[i] = sum;
        const int64_t y = target_at(targets, row_of[i]);
        if (y >= v0 && y < v0 + vc) target_logit[i] = l[y - v0];
      }
    }
    for (int64_t i = 0; i < tr; ++i) {
      lse[i] = run_max[i] + std::log(run_sum[i]);
      const float li = lse[i] - target_logit[i];
      if (rl) rl[row_of[i]] = li;
      loss_sum += rw ? static_cast<double>(rw[row_of[i]]) * li : li;
      if (rw) coef[i] = loss_scale * rw[row_of[i]];
    }
    if (!want_grads) continue;
    // Pass 2: the same logits again (the same GEMM: the same bits), turned into
    // dlogits = (softmax - onehot) * coef in place, then into the two products.
    for (int64_t v0 = 0; v0 < v; v0 += vc_max) {
      const int64_t vc = std::min(vc_max, v - v0);
      sgemm(false, true, tr, vc, d, 1.0f, hbuf, d, w + v0 * d, d, 0.0f, logits, vc);
#pragma omp parallel for schedule(static) if (tr * vc > 32768)
      for (int64_t i = 0; i < tr; ++i) {
        float* l = logits + i * vc;
        for (int64_t j = 0; j < vc; ++j) l[j] = std::exp(l[j] - lse[i]) * coef[i];
        const int64_t y = target_at(targets, row_of[i]);
        if (y >= v0 && y < v0 + vc) l[y - v0] -= coef[i];
      }
      // dhbuf (+)= dlogits @ lm_head[v0 : v0 + vc]
      if (dh)
        sgemm(false, false, tr, d, vc, 1.0f, logits, vc, w + v0 * d, d, v0 == 0 ? 0.0f : 1.0f,
              dhbuf, d);
      // dlm_head[v0 : v0 + vc] += dlogits^T @ hidden rows, through an explicit transpose: no GEMM
      // here takes a transposed a, so batch-invariant mode (whose kernel has none) runs them all.
      if (dw) {
#pragma omp parallel for schedule(static) if (tr * vc > 32768)
        for (int64_t j = 0; j < vc; ++j)
          for (int64_t i = 0; i < tr; ++i) dlogits_t[j * tr + i] = logits[i * vc + j];
        sgemm(false, false, vc, d, tr, 1.0f, dlogits_t, tr, hbuf, d, 1.0f, dw + v0 * d, d);
      }
    }
    if (dh)
      for (int64_t i = 0; i < tr; ++i)
        std::memcpy(dh + row_of[i] * d, dhbuf + i * d, sizeof(float) * d);
  }
  if (rw)
    loss.data<float>()[0] = static_cast<float>(loss_sum);
  else
    loss.data<float>()[0] = counted > 0 ? static_cast<float>(loss_sum / counted) : 0.0f;
}

}  // namespace loom::cpu
