#include "engine/model/attention_training.h"

#include "kernels/attention_backward.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/gemm_backward.h"

namespace loom {

AttentionTail attention_tail_recompute(const ForwardContext& ctx, int layer, const Tensor& q,
                                       const Tensor& k, const Tensor& v, float scale,
                                       const Tensor& x, const Tensor& gate_proj) {
  const int64_t n = q.dim(0), h = q.dim(1), dv = v.dim(2);
  AttentionTail t;
  const Tensor* kept_o = ctx.kept != nullptr ? ctx.kept->find(layer, kAttentionOut) : nullptr;
  const Tensor* kept_lse = ctx.kept != nullptr ? ctx.kept->find(layer, kAttentionLse) : nullptr;
  if (kept_o != nullptr && kept_lse != nullptr && kept_o->shape() == Shape{n, h, dv} &&
      kept_lse->shape() == Shape{n, h}) {
    t.o = *kept_o;
    t.lse = *kept_lse;
  } else {
    t.o = ctx.take({n, h, dv});
    t.lse = ctx.take({n, h}, DType::kF32);
    causal_attention_varlen_forward(ctx.ex, q, k, v, ctx.batch.cu_seqlens, ctx.batch.max_seqlen,
                                    scale, t.o, t.lse);
    ctx.record(layer, kAttentionOut, t.o);
    ctx.record(layer, kAttentionLse, t.lse);
  }
  t.y = ctx.take({n, h * dv});
  copy_columns(ctx.ex, t.o.reshape({n, h * dv}), 0, t.y);
  if (gate_proj.defined()) {
    t.gate = ctx.take({n, h * dv});
    linear_forward(ctx.ex, x, gate_proj, t.gate);
    mul_sigmoid_inplace(ctx.ex, t.y, t.gate);
  }
  return t;
}

float attention_tail_backward(const ForwardContext& ctx, const Tensor& q, const Tensor& k,
                              const Tensor& v, float scale, const Tensor& x,
                              const Tensor& gate_proj, const Tensor& o_proj,
                              const AttentionTail& tail, const Tensor& d_out, const Tensor& d_x,
                              const std::string& prefix, Gradients& grads, const Tensor& d_q,
                              const Tensor& d_k, const Tensor& d_v) {
  const Workspace::Mark scope(ctx.ws());
  const Exec& ex = ctx.ex;
  const int64_t n = q.dim(0), h = q.dim(1), dv = v.dim(2);
  Tensor d_y = ctx.take({n, h * dv});
  linear_backward(ex, tail.y, o_proj, d_out, d_y, 0.0f,
                  grads.get(prefix + "o_proj.weight", o_proj.shape()));
  Tensor d_o = ctx.take({n, h, dv});
  float beta_x = 0.0f;
  if (gate_proj.defined()) {
    Tensor d_gate = ctx.take({n, h * dv});
    mul_sigmoid_backward(ex, tail.o.reshape({n, h * dv}), tail.gate, d_y, d_o.reshape({n, h * dv}),
                         d_gate);
    linear_backward(ex, x, gate_proj, d_gate, d_x, 0.0f,
                    grads.get(prefix + "gate_proj.weight", gate_proj.shape()));
    beta_x = 1.0f;
  } else {
    copy_columns(ex, d_y, 0, d_o.reshape({n, h * dv}));
  }
  causal_attention_varlen_backward(ex, q, k, v, ctx.batch.cu_seqlens, ctx.batch.max_seqlen, tail.o,
                                   tail.lse, d_o, scale, d_q, d_k, d_v);
  return beta_x;
}

}  // namespace loom
