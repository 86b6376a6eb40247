#include "engine/model/linear_attention.h"

#include <cmath>

#include "kernels/conv.h"
#include "kernels/elementwise.h"
#include "kernels/kda.h"
#include "kernels/norm.h"

namespace loom {
namespace {

// Below this many new tokens the recurrence beats the chunked form's fixed per-chunk work.
constexpr int64_t kRecurrentMaxTokens = 8;
// l2norm epsilon of the references (fla l2norm_fwd, inside the square root).
constexpr float kQkNormEps = 1e-6f;

}  // namespace

void linear_attention_conv_qkv(const ForwardContext& ctx, const Tensor& qkv,
                               const Tensor& conv_weight, int layer, const Tensor& q,
                               const Tensor& k, const Tensor& v) {
  const BatchLayout& batch = ctx.batch;
  const int64_t n = qkv.dim(0);
  const int64_t ck = q.dim(1) * q.dim(2), cv = v.dim(1) * v.dim(2);
  Tensor conv_out = ctx.take(qkv.shape());
  for (size_t s = 0; s < batch.start.size(); ++s) {
    const int64_t b = batch.start[s], e = b + batch.length[s];
    causal_conv1d_forward(ctx.ex, qkv.slice(0, b, e), conv_weight, batch.conv(s, layer),
                          /*apply_silu=*/true, conv_out.slice(0, b, e));
  }
  copy_columns(ctx.ex, conv_out, 0, q.reshape({n, ck}));
  copy_columns(ctx.ex, conv_out, ck, k.reshape({n, ck}));
  copy_columns(ctx.ex, conv_out, 2 * ck, v.reshape({n, cv}));
  l2norm_forward(ctx.ex, q, kQkNormEps, 1.0f, q);
  l2norm_forward(ctx.ex, k, kQkNormEps, 1.0f, k);
}

void linear_attention_delta_rule(const ForwardContext& ctx, const Tensor& q, const Tensor& k,
                                 const Tensor& v, const Tensor& g, const Tensor& beta, int layer,
                                 const Tensor& o) {
  const BatchLayout& batch = ctx.batch;
  const float scale = 1.0f / std::sqrt(static_cast<float>(q.dim(2)));
  for (size_t s = 0; s < batch.start.size(); ++s) {
    const int64_t b = batch.start[s], e = b + batch.length[s];
    // The recurrence's result for a token does not depend on how the sequence was cut into calls;
    // the chunked form's does (where its chunks start), so batch-invariant mode never takes it.
    const bool recurrent = batch.length[s] <= kRecurrentMaxTokens || ctx.ex.batch_invariant;
    auto run = recurrent ? kda_recurrent_forward : kda_chunked_forward;
    run(ctx.ex, q.slice(0, b, e), k.slice(0, b, e), v.slice(0, b, e), g.slice(0, b, e),
        beta.slice(0, b, e), scale, batch.recurrent(s, layer), o.slice(0, b, e));
  }
}

}  // namespace loom
