#include "engine/model/linear_attention.h"

#include <cmath>

#include "kernels/conv.h"
#include "kernels/elementwise.h"
#include "kernels/kda.h"
#include "kernels/norm.h"

namespace loom {
namespace {

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
  causal_conv1d_varlen(ctx.ex, qkv, conv_weight, batch.store->conv_states(layer), batch.state_slots,
                       batch.cu_seqlens, /*apply_silu=*/true, conv_out);
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
  // Every sequence of a batch has at least one row (Model::make_layout), so one row per sequence
  // is a decode step: max_seqlen 1 lets the CUDA path take its batched decode kernel.
  const int64_t decode = q.dim(0) == batch.cu_seqlens.dim(0) - 1 ? 1 : 0;
  kda_varlen_forward(ctx.ex, q, k, v, g, beta, scale, batch.store->recurrent_states(layer),
                     batch.state_slots, batch.cu_seqlens, o, /*max_seqlen=*/decode);
}

}  // namespace loom
