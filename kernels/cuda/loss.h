// CUDA twin of kernels/loss.h's fused cross-entropy: the same contract (checked by that
// dispatcher: f32 hidden, lm_head and gradients), every tensor on the GPU, enqueued on the Exec's
// stream.
//
// Method (the CPU's, with GPU-sized chunks): targets are read back to the host once (one
// synchronisation) to check them before anything is written, count the rows and list the counted
// ones. Counted rows go in chunks of up to kCeRowChunk (gathered), the vocabulary in chunks of up
// to kCeVocabChunk (V split evenly, so no tiny tail chunk; the split depends on V only). Pass 1:
// per vocabulary chunk one cuBLAS GEMM (cuda::matmul, true f32) gives the logits chunk and one
// block per row folds it into an online log-sum-exp (one exp per logit). Pass 2 (gradients only):
// the same GEMM again (skipped when V is one chunk: the logits are still there), turned into
// dlogits = (softmax - onehot) * coef in place, then dhidden (+)= dlogits @ lm_head chunk and
// dlm_head chunk += dlogits^T @ hidden rows. Scratch: (kCeRowChunk * kCeVocabChunk + 2 *
// kCeRowChunk * D + 5 * kCeRowChunk) f32 + counted doubles and i32 at most, from ex.workspace when
// there is one (64 MiB + 8 MiB at D = 1024 and T >= 1024), else stream-ordered allocations.
//
// Speed (H200, T = 4096, V = 163840, D = 2048, gradients included): 220 ms, 4.02x one logits
// GEMM of that shape (50 TFLOP/s over the four f32 GEMMs): the row kernels cost ~nothing, the
// GEMMs everything (tests/gpu/loss_cuda_test.cc's CEBENCH line).
//
// Determinism: fixed reduction orders throughout (kernels/cuda/loss.cu) and cuBLAS's GEMMs, which
// give the same bits for the same shapes on one GPU model: two calls give the same bits. With
// ex.batch_invariant the GEMMs are Loom's fixed-order kernel, and a row's loss and dhidden do not
// depend on the other rows of the call.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "kernels/exec.h"

namespace loom::cuda {

inline constexpr int64_t kCeRowChunk = 1024;     // counted rows per chunk
inline constexpr int64_t kCeVocabChunk = 16384;  // vocabulary entries per logits chunk, at most

void cross_entropy_forward_backward(const Exec& ex, const Tensor& hidden, const Tensor& lm_head,
                                    const Tensor& targets, int64_t ignore_index, float loss_scale,
                                    const Tensor& loss, const Tensor& row_loss,
                                    const Tensor& dhidden, const Tensor& dlm_head,
                                    const Tensor& row_weight, const Tensor& host_targets);

}  // namespace loom::cuda
