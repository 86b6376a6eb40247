// CUDA twins of the backward passes of kernels/norm.h, kernels/activation.h and
// kernels/elementwise.h: the same contracts (checked by those dispatchers, f32 only), every
// tensor on the GPU, enqueued on the Exec's stream. Temporaries (a norm's row scales, column
// partials, a scatter's sorted order) are stream-ordered allocations. Parameter gradients are
// deterministic (kernels/cuda/backward.cu says how); the row scatters match the CPU bit for bit.
#pragma once

#include "core/tensor.h"
#include "kernels/exec.h"
#include "kernels/moe.h"

namespace loom::cuda {

void rmsnorm_backward(const Exec& ex, const Tensor& x, const Tensor& w, float eps,
                      float weight_offset, const Tensor& dout, const Tensor& dx, const Tensor& dw);
void l2norm_backward(const Exec& ex, const Tensor& x, float eps, float scale, const Tensor& dout,
                     const Tensor& dx);
void silu_mul_backward(const Exec& ex, const Tensor& gate, const Tensor& up, const Tensor& dout,
                       const Tensor& dgate, const Tensor& dup);
void add_bias_backward(const Exec& ex, const Tensor& dx, const Tensor& dbias);
void mul_sigmoid_backward(const Exec& ex, const Tensor& x, const Tensor& gate, const Tensor& dout,
                          const Tensor& dx, const Tensor& dgate);
void mul_silu_backward(const Exec& ex, const Tensor& x, const Tensor& gate, const Tensor& dout,
                       const Tensor& dx, const Tensor& dgate);
void mul_sigmoid_rows_backward(const Exec& ex, const Tensor& x, const Tensor& gate,
                               const Tensor& dout, const Tensor& dx, const Tensor& dgate);
void sigmoid_backward(const Exec& ex, const Tensor& y, const Tensor& dout, const Tensor& dx);
// initial_state, dfinal_state, dinitial_state may be undefined (kernels/conv.h).
void causal_conv1d_backward(const Exec& ex, const Tensor& x, const Tensor& weight,
                            const Tensor& initial_state, bool apply_silu, const Tensor& dout,
                            const Tensor& dfinal_state, const Tensor& dx, const Tensor& dweight,
                            const Tensor& dinitial_state);
// The packed batch of zero-state sequences in one pass (kernels/conv.h).
void causal_conv1d_varlen_backward(const Exec& ex, const Tensor& x, const Tensor& weight,
                                   const Tensor& cu_seqlens, bool apply_silu, const Tensor& dout,
                                   const Tensor& dx, const Tensor& dweight);
// One block per value head, the CPU's segment replay; head dims up to 1024 (refused beyond).
void kda_recurrent_backward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& g, const Tensor& beta, float scale,
                            const Tensor& initial_state, const Tensor& d_out,
                            const Tensor& d_final_state, const Tensor& dq, const Tensor& dk,
                            const Tensor& dv, const Tensor& dg, const Tensor& dbeta,
                            const Tensor& d_initial_state);
void kda_gate_backward(const Exec& ex, const Tensor& f, const Tensor& A_log, const Tensor& dt_bias,
                       float lower_bound, const Tensor& d_g, const Tensor& d_f,
                       const Tensor& d_A_log, const Tensor& d_dt_bias);
void attnres_aggregate_backward(const Exec& ex, const Tensor& sources, const Tensor& query,
                                const Tensor& key_norm, const Tensor& out_norm, float eps,
                                const Tensor& dout, const Tensor& dsources, const Tensor& dquery,
                                const Tensor& dkey_norm, const Tensor& dout_norm);
// Training attention (kernels/attention_backward.h): any T with head dims d <= 192, dv <= 128
// (the tiled kernels); larger head dims up to launch::kAttnMaxHeadDim with T up to
// launch::kAttnMaxTrainLen (refused beyond, with the limits named).
void causal_attention_forward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                              float scale, const Tensor& out, const Tensor& lse);
void causal_attention_backward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& out, const Tensor& lse, const Tensor& d_out,
                               float scale, const Tensor& dq, const Tensor& dk, const Tensor& dv);
// Their packed-batch forms: one launch over every sequence (max_seqlen must bound every
// sequence's length; the same limits).
void causal_attention_varlen_forward(const Exec& ex, const Tensor& q, const Tensor& k,
                                     const Tensor& v, const Tensor& cu_seqlens, int64_t max_seqlen,
                                     float scale, const Tensor& out, const Tensor& lse);
void causal_attention_varlen_backward(const Exec& ex, const Tensor& q, const Tensor& k,
                                      const Tensor& v, const Tensor& cu_seqlens, int64_t max_seqlen,
                                      const Tensor& out, const Tensor& lse, const Tensor& d_out,
                                      float scale, const Tensor& dq, const Tensor& dk,
                                      const Tensor& dv);
// The MoE backwards (kernels/moe.h). Index tensors (row_of_slot, expert_ids, offsets) are read
// back and checked on the host first (a training step's few thousand entries), so a bad index
// aborts with the CPU's words instead of reading out of bounds.
void moe_route_backward(const Exec& ex, const Tensor& logits, const Tensor& expert_ids,
                        const RouterParams& params, const Tensor& d_weights,
                        const Tensor& d_logits);
void moe_aux_loss_forward_backward(const Exec& ex, const Tensor& logits, const Tensor& expert_ids,
                                   RouterScore score, float alpha, const Tensor& loss,
                                   const Tensor& d_logits);
void moe_permute_backward(const Exec& ex, const Tensor& d_x_sorted, const Tensor& row_of_slot,
                          const Tensor& d_x);
void moe_unpermute_combine_backward(const Exec& ex, const Tensor& y, const Tensor& row_of_slot,
                                    const Tensor& weights, const Tensor& d_out, const Tensor& d_y,
                                    const Tensor& d_weights);
// Per owned expert, the CPU's sequence of products (cuBLAS through matmul) and silu_mul's
// backward on the GPU; the offsets come to the host to slice the experts' rows.
void moe_grouped_swiglu_backward(const Exec& ex, const Tensor& x, const Tensor& offsets,
                                 const Tensor& w_gate, const Tensor& w_up, const Tensor& w_down,
                                 const Tensor& gate_up, const Tensor& d_y, const Tensor& d_x,
                                 const Tensor& d_w_gate, const Tensor& d_w_up,
                                 const Tensor& d_w_down);
// dst[ids[i], :] += src[i, :] in source order for every target row (embedding_backward,
// gather_rows_backward). ids: [n] i32/i64 on the host or the GPU, read back and checked in
// [0, dst rows) before anything is written (abort naming `op` and the first bad index).
void scatter_add_rows(const Exec& ex, const char* op, const Tensor& src, const Tensor& ids,
                      const Tensor& dst);

}  // namespace loom::cuda
