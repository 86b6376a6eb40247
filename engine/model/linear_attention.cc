#include "engine/model/linear_attention.h"

#include <cmath>

#include "kernels/conv.h"
#include "kernels/elementwise.h"
#include "kernels/kda.h"
#include "kernels/kda_backward.h"
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
  // The host-known longest sequence picks the CUDA kernels: 1 is a decode step (one batched
  // decode launch), a few rows skip the chunked launches.
  kda_varlen_forward(ctx.ex, q, k, v, g, beta, scale, batch.store->recurrent_states(layer),
                     batch.state_slots, batch.cu_seqlens, o, batch.max_seqlen);
}

namespace {

float delta_rule_scale(const Tensor& q) { return 1.0f / std::sqrt(static_cast<float>(q.dim(2))); }

// A zero [rows, cols] state in step memory.
Tensor zero_state(const ForwardContext& ctx, Shape shape) {
  Tensor t = ctx.take(shape, DType::kF32);
  zero_fill(ctx.ex, t);
  return t;
}

}  // namespace

void linear_attention_conv_qkv_recompute(const ForwardContext& ctx,
                                         const std::vector<RowSpan>& seqs, const Tensor& qkv,
                                         const Tensor& conv_weight, const Tensor& q_raw,
                                         const Tensor& k_raw, const Tensor& q, const Tensor& k,
                                         const Tensor& v) {
  const Workspace::Mark scope(ctx.ws());
  const int64_t n = qkv.dim(0), channels = qkv.dim(1), width = conv_weight.dim(1);
  const int64_t ck = q.dim(1) * q.dim(2), cv = v.dim(1) * v.dim(2);
  Tensor conv_out = ctx.take(qkv.shape());
  for (const auto& [b, e] : seqs)
    causal_conv1d_forward(ctx.ex, qkv.slice(0, b, e), conv_weight,
                          zero_state(ctx, {width - 1, channels}), /*apply_silu=*/true,
                          conv_out.slice(0, b, e));
  copy_columns(ctx.ex, conv_out, 0, q_raw.reshape({n, ck}));
  copy_columns(ctx.ex, conv_out, ck, k_raw.reshape({n, ck}));
  copy_columns(ctx.ex, conv_out, 2 * ck, v.reshape({n, cv}));
  l2norm_forward(ctx.ex, q_raw, kQkNormEps, 1.0f, q);
  l2norm_forward(ctx.ex, k_raw, kQkNormEps, 1.0f, k);
}

void linear_attention_conv_qkv_backward(const ForwardContext& ctx, const std::vector<RowSpan>& seqs,
                                        const Tensor& qkv, const Tensor& conv_weight,
                                        const Tensor& q_raw, const Tensor& k_raw, const Tensor& d_q,
                                        const Tensor& d_k, const Tensor& d_v, const Tensor& d_qkv,
                                        const Tensor& d_conv_weight) {
  const Workspace::Mark scope(ctx.ws());
  const int64_t n = qkv.dim(0);
  const int64_t ck = d_q.dim(1) * d_q.dim(2), cv = d_v.dim(1) * d_v.dim(2);
  l2norm_backward(ctx.ex, q_raw, kQkNormEps, 1.0f, d_q, d_q);
  l2norm_backward(ctx.ex, k_raw, kQkNormEps, 1.0f, d_k, d_k);
  Tensor d_conv = ctx.take(qkv.shape());
  scatter_columns(ctx.ex, d_q.reshape({n, ck}), 0, d_conv);
  scatter_columns(ctx.ex, d_k.reshape({n, ck}), ck, d_conv);
  scatter_columns(ctx.ex, d_v.reshape({n, cv}), 2 * ck, d_conv);
  for (const auto& [b, e] : seqs)
    causal_conv1d_backward(ctx.ex, qkv.slice(0, b, e), conv_weight, Tensor(),
                           /*apply_silu=*/true, d_conv.slice(0, b, e), Tensor(),
                           d_qkv.slice(0, b, e), d_conv_weight, Tensor());
}

void linear_attention_delta_rule_recompute(const ForwardContext& ctx,
                                           const std::vector<RowSpan>& seqs, const Tensor& q,
                                           const Tensor& k, const Tensor& v, const Tensor& g,
                                           const Tensor& beta, const Tensor& o) {
  const Workspace::Mark scope(ctx.ws());
  for (const auto& [b, e] : seqs) {
    // The form the forward took for this sequence (kda_varlen_forward's rule), so o is its bits.
    const auto form = kda_varlen_takes_recurrence(e - b, ctx.ex.batch_invariant)
                          ? kda_recurrent_forward
                          : kda_chunked_forward;
    form(ctx.ex, q.slice(0, b, e), k.slice(0, b, e), v.slice(0, b, e), g.slice(0, b, e),
         beta.slice(0, b, e), delta_rule_scale(q), zero_state(ctx, {v.dim(1), q.dim(2), v.dim(2)}),
         o.slice(0, b, e));
  }
}

void linear_attention_delta_rule_backward(const ForwardContext& ctx,
                                          const std::vector<RowSpan>& seqs, const Tensor& q,
                                          const Tensor& k, const Tensor& v, const Tensor& g,
                                          const Tensor& beta, const Tensor& d_o, const Tensor& d_q,
                                          const Tensor& d_k, const Tensor& d_v, const Tensor& d_g,
                                          const Tensor& d_beta) {
  const Workspace::Mark scope(ctx.ws());
  for (const auto& [b, e] : seqs) {
    const auto form = kda_backward_takes_recurrence(ctx.ex, e - b) ? kda_recurrent_backward
                                                                   : kda_chunked_backward;
    form(ctx.ex, q.slice(0, b, e), k.slice(0, b, e), v.slice(0, b, e), g.slice(0, b, e),
         beta.slice(0, b, e), delta_rule_scale(q), zero_state(ctx, {v.dim(1), q.dim(2), v.dim(2)}),
         d_o.slice(0, b, e), Tensor(), d_q.slice(0, b, e), d_k.slice(0, b, e), d_v.slice(0, b, e),
         d_g.slice(0, b, e), d_beta.slice(0, b, e), Tensor());
  }
}

}  // namespace loom
