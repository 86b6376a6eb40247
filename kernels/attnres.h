// Block Attention Residuals (MODELS.md, "Block Attention Residuals"): a per-token softmax over
// depth. For each token, with sources v_i ([D] each), pseudo-query w ([D]) and key-norm weight r:
//   k_i = rmsnorm_r(v_i);  p = softmax_i(k_i . w);  m = sum_i p_i v_i;  out = rmsnorm_o(m)
// where rmsnorm_o uses the consuming sublayer's pre-norm weight (fla folds the pre-norm into the
// aggregation). Both norms use `eps`. All f32.
#pragma once

#include "core/tensor.h"
#include "kernels/exec.h"

namespace loom {

// sources: [S, N, D] contiguous, S >= 1 (the model keeps its completed block sums and the running
// partial sum stacked in one workspace tensor and passes its first S entries); query, key_norm,
// out_norm: [D]; out: [N, D] (may not alias a source).
void attnres_aggregate(const Exec& ex, const Tensor& sources, const Tensor& query,
                       const Tensor& key_norm, const Tensor& out_norm, float eps,
                       const Tensor& out);

}  // namespace loom
