#include "engine/model/linear_attention.h"

#include <cmath>

#include "kernels/conv.h"
#include "kernels/elementwise.h"
#include "kernels/kda.h"
#include "kernels/kda_backward.h"
#include "kernels/kda_decode_step.h"
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

bool linear_attention_is_decode(const ForwardContext& ctx, int64_t rows) {
  const BatchLayout& batch = ctx.batch;
  return batch.max_seqlen == 1 && batch.cu_seqlens.defined() && batch.cu_seqlens.dim(0) == rows + 1;
}

void linear_attention_decode_step(const ForwardContext& ctx, const Tensor& qkv,
                                  const Tensor& conv_weight, int layer, const Tensor& f,
                                  const Tensor& A_log, const Tensor& dt_bias, float lower_bound,
                                  const Tensor& beta, const Tensor& norm_weight, float norm_eps,
                                  const Tensor& gate, bool gate_silu, const Tensor& o) {
  const BatchLayout& batch = ctx.batch;
  KdaDecodeStep s;
  s.qkv = qkv;
  s.conv_weight = conv_weight;
  s.conv_states = batch.store->conv_states(layer);
  s.state_slots = batch.state_slots;
  s.f = f;
  s.A_log = A_log;
  s.dt_bias = dt_bias;
  s.lower_bound = lower_bound;
  s.qk_eps = kQkNormEps;
  s.beta = beta;
  s.cu_seqlens = batch.cu_seqlens;
  s.states = batch.store->recurrent_states(layer);
  s.scale = 1.0f / std::sqrt(static_cast<float>(s.states.dim(2)));
  s.norm_weight = norm_weight;
  s.norm_eps = norm_eps;
  s.gate = gate;
  s.gate_silu = gate_silu;
  kda_decode_step(ctx.ex, s, o);
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

// A zero f32 tensor in step memory: the state pools the recomputation starts every sequence from.
Tensor zero_states(const ForwardContext& ctx, Shape shape) {
  Tensor t = ctx.take(shape, DType::kF32);
  zero_fill(ctx.ex, t);
  return t;
}

}  // namespace

// The recomputations run the forward's own varlen kernels on zeroed pools with the forward's
// slots (sequence s in slot s), so they give the forward's bits.
void linear_attention_conv_qkv_recompute(const ForwardContext& ctx, const Tensor& qkv,
                                         const Tensor& conv_weight, const Tensor& q_raw,
                                         const Tensor& k_raw, const Tensor& q, const Tensor& k,
                                         const Tensor& v) {
  const Workspace::Mark scope(ctx.ws());
  const BatchLayout& batch = ctx.batch;
  const int64_t n = qkv.dim(0), channels = qkv.dim(1), width = conv_weight.dim(1);
  const int64_t ck = q.dim(1) * q.dim(2), cv = v.dim(1) * v.dim(2);
  const int64_t b = batch.cu_seqlens.dim(0) - 1;
  Tensor conv_out = ctx.take(qkv.shape());
  causal_conv1d_varlen(ctx.ex, qkv, conv_weight, zero_states(ctx, {b, width - 1, channels}),
                       batch.state_slots, batch.cu_seqlens, /*apply_silu=*/true, conv_out);
  copy_columns(ctx.ex, conv_out, 0, q_raw.reshape({n, ck}));
  copy_columns(ctx.ex, conv_out, ck, k_raw.reshape({n, ck}));
  copy_columns(ctx.ex, conv_out, 2 * ck, v.reshape({n, cv}));
  l2norm_forward(ctx.ex, q_raw, kQkNormEps, 1.0f, q);
  l2norm_forward(ctx.ex, k_raw, kQkNormEps, 1.0f, k);
}

void linear_attention_conv_qkv_backward(const ForwardContext& ctx, const Tensor& qkv,
                                        const Tensor& conv_weight, const Tensor& q_raw,
                                        const Tensor& k_raw, const Tensor& d_q, const Tensor& d_k,
                                        const Tensor& d_v, const Tensor& d_qkv,
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
  causal_conv1d_varlen_backward(ctx.ex, qkv, conv_weight, ctx.batch.cu_seqlens,
                                /*apply_silu=*/true, d_conv, d_qkv, d_conv_weight);
}

void linear_attention_delta_rule_recompute(const ForwardContext& ctx, const Tensor& q,
                                           const Tensor& k, const Tensor& v, const Tensor& g,
                                           const Tensor& beta, const Tensor& o) {
  const Workspace::Mark scope(ctx.ws());
  const BatchLayout& batch = ctx.batch;
  const int64_t b = batch.cu_seqlens.dim(0) - 1;
  kda_varlen_forward(ctx.ex, q, k, v, g, beta, delta_rule_scale(q),
                     zero_states(ctx, {b, v.dim(1), q.dim(2), v.dim(2)}), batch.state_slots,
                     batch.cu_seqlens, o, batch.max_seqlen);
}

void linear_attention_delta_rule_backward(const ForwardContext& ctx, const Tensor& q,
                                          const Tensor& k, const Tensor& v, const Tensor& g,
                                          const Tensor& beta, const Tensor& d_o, const Tensor& d_q,
                                          const Tensor& d_k, const Tensor& d_v, const Tensor& d_g,
                                          const Tensor& d_beta) {
  kda_varlen_backward(ctx.ex, q, k, v, g, beta, delta_rule_scale(q), ctx.batch.cu_seqlens,
                      ctx.batch.max_seqlen, d_o, d_q, d_k, d_v, d_g, d_beta);
}

}  // namespace loom
