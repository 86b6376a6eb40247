// Training losses. All f32.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "kernels/exec.h"

namespace loom {

// Cross-entropy of the next-token targets over the vocabulary, fused with the lm_head product and
// with its own backward, so that no [T, V] logit or probability tensor ever exists:
//   logits = hidden @ lm_head^T;  row_loss[t] = logsumexp(logits[t]) - logits[t, targets[t]]
//   loss = mean of row_loss over the counted rows (targets[t] != ignore_index), 0 when none
//   dhidden = loss_scale * d loss / d hidden   (written; zero rows at ignored targets)
//   dlm_head += loss_scale * d loss / d lm_head (accumulated: a parameter gradient; the embedding's
//               gradient when the head is tied)
// loss_scale is 1 for the gradient of this call's mean; count / total_count when a step's loss is
// the mean over several calls (micro-batches, data-parallel ranks).
//
// With row_weight ([T] f32) defined, the objective is a weighted sum instead of the mean (a policy
// gradient's per-token weights, trainer/rl):
//   loss = sum over the counted rows of row_weight[t] * row_loss[t]
//   dhidden, dlm_head: loss_scale * the gradients of that sum (row t's dlogits scaled by
//   loss_scale * row_weight[t]; a weight may be negative or zero)
//
// hidden: [T, D]; lm_head: [V, D]; targets: [T] i32 or i64, each in [0, V) or == ignore_index
// (checked before anything is written); loss: [1]; row_loss: [T] (0 at ignored rows) or undefined;
// dhidden: [T, D] or undefined, dlm_head: [V, D] or undefined (both undefined: the loss only).
//
// CPU: the counted rows go in chunks of up to 256 (gathered into a contiguous block), the
// vocabulary in chunks of up to 4096. Per row chunk, pass 1 takes the logits chunk by chunk and
// keeps an online log-sum-exp per row (running max, rescaled sum); pass 2 recomputes each logits
// chunk, turns it into dlogits = (softmax - onehot) * loss_scale / count in place and multiplies it
// into dhidden and (through a transposed copy) dlm_head. That is four GEMMs of T x V x D (the
// logits twice) instead of three, for a peak scratch of (2 * 256 * 4096 + 2 * 256 * D + 4 * 256)
// f32 (12 MiB at D = 2048; from ex.workspace when there is one) whatever T and V.
//
// CUDA (kernels/cuda/loss.h): the same two passes with GPU-sized chunks (1024 rows, up to 16384
// vocabulary entries) on cuBLAS, one block per row for the online log-sum-exp; the targets are
// checked and the counted rows listed on the host: from host_targets when the caller has them
// there (the trainer does: no read back, no synchronisation), else from one read back of targets.
// Two calls give the same bits.
//
// host_targets: undefined, or [T] i32/i64 on the host holding targets' values (checked on shape
// and dtype, trusted on values). The CPU, whose targets are on the host, reads targets.
//
// Determinism: the per-row loops split rows over threads, row losses are summed in row order and
// dlm_head receives the row chunks in order; the GEMMs are OpenBLAS's, whose results depend on its
// thread count (measured), so a call gives the same bits for a fixed thread count. With
// ex.batch_invariant the GEMMs are Loom's fixed-order kernel and the result is the same bits for
// any thread count.
void cross_entropy_forward_backward(const Exec& ex, const Tensor& hidden, const Tensor& lm_head,
                                    const Tensor& targets, int64_t ignore_index, float loss_scale,
                                    const Tensor& loss, const Tensor& row_loss,
                                    const Tensor& dhidden, const Tensor& dlm_head,
                                    const Tensor& row_weight = Tensor(),
                                    const Tensor& host_targets = Tensor());

}  // namespace loom
