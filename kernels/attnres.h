// Block Attention Residuals (MODELS.md, "Block Attention Residuals"): a per-token softmax over
// depth. For each token, with sources v_i ([D] each), pseudo-query w ([D]) and key-norm weight r:
//   k_i = rmsnorm_r(v_i);  p = softmax_i(k_i . w);  m = sum_i p_i v_i;  out = rmsnorm_o(m)
// where rmsnorm_o uses the consuming sublayer's pre-norm weight (fla folds the pre-norm into the
// aggregation). Both norms use `eps`. All f32, but for the forward's out, which may be bf16 on
// CUDA (the normalised sublayer input, rounded to nearest even from the f32 result).
#pragma once

#include "core/tensor.h"
#include "kernels/exec.h"

namespace loom {

// sources: [S, N, D] contiguous, S >= 1 (the model keeps its completed block sums and the running
// partial sum stacked in one workspace tensor and passes its first S entries); query, key_norm,
// out_norm: [D]; out: [N, D] f32 (or bf16 on CUDA; may not alias a source).
void attnres_aggregate(const Exec& ex, const Tensor& sources, const Tensor& query,
                       const Tensor& key_norm, const Tensor& out_norm, float eps,
                       const Tensor& out);

// Backward of attnres_aggregate, recomputing the forward per token (nothing saved but its inputs).
// With g = dout * o, mhat = m / rms(m), u = r * w, vhat_i = v_i / rms(v_i) and s_i = vhat_i . u:
//   dm = (g - mhat * mean(g * mhat)) / rms(m);  dp_i = dm . v_i;  ds_i = p_i (dp_i - sum_k p_k
//   dp_k) dv_i = p_i dm + ds_i / rms(v_i) * (u - s_i * vhat_i / D) du = sum_i ds_i vhat_i;  dquery
//   += du * r;  dkey_norm += du * w;  dout_norm += dout * mhat
// (rms(y) = sqrt(mean(y^2) + eps)). sources, query, key_norm, out_norm, eps as for the forward;
// dout: [N, D]; dsources: [S, N, D] contiguous, written (may alias sources: a token's rows are read
// before they are written); dquery, dkey_norm, dout_norm: [D], accumulated (parameter gradients).
// The parameter gradients are summed over fixed blocks of tokens, then over the blocks in order:
// same bits whatever the thread count. Uses [ceil(N / 16), 6 D + 4 S] f32 of scratch (from
// ex.workspace when there is one).
void attnres_aggregate_backward(const Exec& ex, const Tensor& sources, const Tensor& query,
                                const Tensor& key_norm, const Tensor& out_norm, float eps,
                                const Tensor& dout, const Tensor& dsources, const Tensor& dquery,
                                const Tensor& dkey_norm, const Tensor& dout_norm);

}  // namespace loom
