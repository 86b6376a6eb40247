// Launchers of the fused cross-entropy's row kernels (kernels/cuda/loss.cu), behind
// kernels/cuda/loss.cc. Raw device pointers, f32 unless named otherwise, row-major and contiguous;
// no Loom or Abseil header (nvcc parses this). Every launcher enqueues on `stream`, checks the
// launch and never synchronises.
//
// A "chunk" is up to `rows` counted rows (targets[t] != ignore_index) of the call, in row order:
// chunk row i is hidden row row_of[i] (row_of already offset to the chunk's first counted row).
// targets are i32 or i64 (targets_i64) on the device, indexed by hidden row.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace loom::cuda::launch {

// Zeroes row_loss[t] and dhidden[t, :] (either may be null) for every t < T whose target is
// ignore_index: an ignored row's loss and gradient (a counted row's are written later).
void ce_zero_ignored(cudaStream_t stream, const void* targets, bool targets_i64,
                     int64_t ignore_index, int64_t T, int64_t D, float* row_loss, float* dhidden);

// dst[i, :] = src[row_of[i], :] for i < rows (gather: the chunk's hidden rows), or, with
// scatter, dst[row_of[i], :] = src[i, :] (the chunk's dhidden rows put back).
void ce_copy_rows(cudaStream_t stream, const float* src, const int32_t* row_of, int64_t rows,
                  int64_t D, bool scatter, float* dst);

// Pass 1 over one vocabulary chunk [v0, v0 + vc): logits [rows, vc]. Per chunk row i, one block
// folds the chunk into the row's running log-sum-exp (run_max[i], run_sum[i]; `first` starts
// them) and, where the row's target falls in the chunk, records its logit in target_logit[i].
// `last` (the final vocabulary chunk) then finishes the row:
//   lse[i] = run_max + log(run_sum); l = lse[i] - target_logit[i];
//   row_loss[row_of[i]] = l (row_loss may be null);
//   contrib[i] = row_weight ? row_weight[row_of[i]] * l : l (double; the call's loss is their sum);
//   coef[i] = row_weight ? loss_scale * row_weight[row_of[i]] : mean_coef (the dlogits factor).
struct CeRowState {
  float* run_max;
  float* run_sum;
  float* target_logit;
  float* lse;
  float* coef;
  double* contrib;
};
void ce_lse_chunk(cudaStream_t stream, const float* logits, int64_t rows, int64_t vc, int64_t v0,
                  const void* targets, bool targets_i64, const int32_t* row_of, bool first,
                  bool last, const float* row_weight, float loss_scale, float mean_coef,
                  float* row_loss, const CeRowState& st);

// Pass 2 over one vocabulary chunk, in place: logits[i, j] = exp(logits[i, j] - lse[i]) * coef[i],
// minus coef[i] at the row's target: dlogits = (softmax - onehot) * coef.
void ce_dlogits_chunk(cudaStream_t stream, float* logits, int64_t rows, int64_t vc, int64_t v0,
                      const void* targets, bool targets_i64, const int32_t* row_of,
                      const float* lse, const float* coef);

// loss[0] = sum of contrib[0 .. n) in a fixed order (double), divided by n unless weighted;
// 0 when n = 0.
void ce_loss_total(cudaStream_t stream, const double* contrib, int64_t n, bool weighted,
                   float* loss);

}  // namespace loom::cuda::launch
