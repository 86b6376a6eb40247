// Launchers of the CUDA backward kernels (kernels/cuda/backward.cu): raw device pointers, f32,
// contiguous, enqueued on `stream`. The host side (kernels/cuda/backward.cc) checks the contracts
// of kernels/{norm,activation,elementwise}.h first.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace loom::cuda::launch {

// Rows summed into column partials, this many rows a partial (kernels/cuda/backward.cu): the
// scratch a column sum needs is ceil(n / kColumnSumRows) * c floats.
inline constexpr int64_t kColumnSumRows = 64;

// rstd[r] = 1 / sqrt(mean(x[r]^2) + eps) over rows of d.
void row_rstd(cudaStream_t stream, const float* x, int64_t n, int64_t d, float eps, float* rstd);
// dw[j] += sum_r dout[r, j] * x[r, j] * rstd[r] (rstd null: 1), summed in a fixed order: rows in
// chunks of kColumnSumRows into `partials`, then the chunks (8 stripes of chunks, each in order,
// the stripes in order).
void column_sums(cudaStream_t stream, const float* dout, const float* x, const float* rstd,
                 int64_t n, int64_t c, float* partials, float* dw);
// dx = rstd * ((off + w) * dout - xhat * mean((off + w) * dout * xhat)), xhat = x * rstd.
void rmsnorm_dx(cudaStream_t stream, const float* x, const float* w, float off, const float* dout,
                const float* rstd, int64_t n, int64_t d, float* dx);
void l2norm_dx(cudaStream_t stream, const float* x, const float* dout, int64_t n, int64_t d,
               float eps, float scale, float* dx);

enum class GateGrad : int { kSiluMul, kMulSigmoid, kMulSilu };
// Elementwise gate backward over n elements:
//   kSiluMul:    a = gate, b = up:  da = dout * up * silu'(gate), db = dout * silu(gate);
//   kMulSigmoid: a = x, b = gate:  da = dout * sigmoid(gate),    db = dout * x * sigmoid'(gate);
//   kMulSilu:    a = x, b = gate:  da = dout * silu(gate),       db = dout * x * silu'(gate).
void gate_backward(cudaStream_t stream, GateGrad kind, const float* a, const float* b,
                   const float* dout, int64_t n, float* da, float* db);
void sigmoid_backward(cudaStream_t stream, const float* y, const float* dout, int64_t n, float* dx);
// dx[r, :] = dout[r, :] * sigmoid(gate[r]), dgate[r] = sigmoid'(gate[r]) * (dout[r, :] . x[r, :]).
void mul_sigmoid_rows_backward(cudaStream_t stream, const float* x, const float* gate,
                               const float* dout, int64_t n, int64_t c, float* dx, float* dgate);
// dst[ids[perm[k]], :] += src[perm[k], :] for k in each segment [seg_begin[s], seg_begin[s+1]),
// all k of a segment naming the same row seg_row[s], in increasing k: perm lists the source rows
// stably sorted by their target, so every target row receives its sources in source order.
void scatter_add_segments(cudaStream_t stream, const float* src, const int64_t* perm,
                          const int64_t* seg_begin, const int64_t* seg_row, int64_t segments,
                          int64_t c, float* dst);

}  // namespace loom::cuda::launch

namespace loom::cuda::launch {

// causal_conv1d_backward over one sequence (kernels/conv.h), in four launches: dpre (the
// activation's gradient, into `dpre` scratch [T, C]), dweight += (chunked column sums, as
// column_sums), dinitial_state, dx (may alias dout: dout is read only by the first launch).
// s0, dfin, ds0 may be null (no initial state, no gradient of the final state, not wanted).
struct ConvBackwardArgs {
  const float* x;       // [T, C]
  const float* weight;  // [C, W]
  const float* s0;      // [W-1, C] or null
  const float* dout;    // [T, C]
  const float* dfin;    // [W-1, C] or null
  float* dx;            // [T, C]
  float* dweight;       // [C, W]
  float* ds0;           // [W-1, C] or null
  float* dpre;          // scratch [T, C]
  float* partials;      // scratch [ceil(T / kColumnSumRows), C, W]
  int64_t T, C, W;
  bool silu;
  // A packed batch of zero-state sequences (s0, dfin, ds0 null): i64 [num_seqs + 1] row offsets
  // on the device; null for one sequence of T rows.
  const int64_t* cu = nullptr;
  int64_t num_seqs = 1;
};
void causal_conv1d_backward(cudaStream_t stream, const ConvBackwardArgs& a);

}  // namespace loom::cuda::launch

namespace loom::cuda::launch {

// kda_gate_backward's elementwise part (kernels/kda_backward.h): d_f = d_g * dg/dx and
// d_alog = d_g * dg/dA_log per element, with x = f + dt_bias (bias may be null).
void kda_gate_grads(cudaStream_t stream, const float* f, const float* a_log, const float* bias,
                    float lower_bound, const float* d_g, int64_t T, int64_t width, int64_t H,
                    float* d_f, float* d_alog);
// out[h] += sum of cols[h * per_group .. (h + 1) * per_group) in order.
void group_sums(cudaStream_t stream, const float* cols, int64_t groups, int64_t per_group,
                float* out);

}  // namespace loom::cuda::launch

namespace loom::cuda::launch {

// moe_permute_backward: d_x[t] += sum over i in order of d_x_sorted[rows[t, i]] (rows of -1
// skipped; a token with none untouched).
void moe_permute_backward(cudaStream_t stream, const float* d_x_sorted, const int32_t* rows,
                          int64_t T, int64_t K, int64_t D, float* d_x);
// moe_unpermute_combine_backward: d_y[rows[j]] = w[j] * d_out[t]; d_w[j] = d_out[t] . y[rows[j]]
// (a double sum; 0 for a row of -1).
void moe_unpermute_combine_backward(cudaStream_t stream, const float* y, const int32_t* rows,
                                    const float* w, const float* d_out, int64_t T, int64_t K,
                                    int64_t D, float* d_y, float* d_w);
// moe_route_backward, one thread a row (the CPU's sequential sums), with [T, E] scratch for the
// scores and their gradients.
void moe_route_backward(cudaStream_t stream, const float* logits, const int32_t* ids,
                        const float* d_w, int64_t T, int64_t E, int64_t K, bool sigmoid,
                        bool renormalize, float scaling, float* s_scratch, float* ds_scratch,
                        float* d_logits);

}  // namespace loom::cuda::launch

namespace loom::cuda::launch {

// attnres_aggregate_backward (kernels/attnres.h): one block per 16 tokens (the CPU's blocks),
// each token recomputed and differentiated by a warp (warp reductions; widths whose per-warp rows
// fit shared memory, D up to about 1000) or by the whole block (block reductions; wider rows); the
// blocks' parameter partials [nblk, 3 D] (dquery, dkey_norm, dout_norm) then added in a fixed
// order (the same bits every run).
inline constexpr int64_t kAttnResTokenBlock = 16;
void attnres_backward(cudaStream_t stream, const float* sources, const float* query,
                      const float* key_norm, const float* out_norm, float eps, const float* dout,
                      int64_t S, int64_t N, int64_t D, float* dsources, float* partials,
                      float* dquery, float* dkey_norm, float* dout_norm);

}  // namespace loom::cuda::launch

namespace loom::cuda::launch {

// causal_attention_forward / _backward (kernels/attention_backward.h). Head dims within
// attention_tiled_supported (d <= 192, dv <= 128): the tiled kernels of
// kernels/cuda/attention_train.cu (FlashAttention-2's passes, f32, no length limit). Larger ones:
// the CPU's loops with the length-d dot products as warp reductions; forward and the dq pass take a
// block per (query, head) with the query's scores in shared memory (kAttnMaxTrainLen tokens at
// most), the dk/dv pass a block per (key, kv head), summing its query heads in order and the
// queries in ascending order. d_rows: [T, Hq] scratch for D_i = dO_i . O_i. Head dims up to
// kAttnMaxHeadDim. One sequence of T rows with cu null; else a packed batch, cu: i64 [nseq + 1]
// row offsets on the device, each row attending within its own sequence, max_T at least every
// sequence's length.
inline constexpr int64_t kAttnMaxHeadDim = 512;
inline constexpr int64_t kAttnMaxTrainLen = 49152;  // the scores' shared memory: 192 KB
void causal_attention_forward(cudaStream_t stream, const float* q, const float* k, const float* v,
                              float scale, int64_t T, int64_t Hq, int64_t Hkv, int64_t d,
                              int64_t dv, float* out, float* lse, const int64_t* cu = nullptr,
                              int64_t nseq = 1, int64_t max_T = 0);
void causal_attention_backward(cudaStream_t stream, const float* q, const float* k, const float* v,
                               const float* out, const float* lse, const float* d_out, float scale,
                               int64_t T, int64_t Hq, int64_t Hkv, int64_t d, int64_t dv,
                               float* d_rows, float* dq, float* dk, float* dvv,
                               const int64_t* cu = nullptr, int64_t nseq = 1, int64_t max_T = 0);

}  // namespace loom::cuda::launch

namespace loom::cuda::launch {

// moe_aux_loss_forward_backward (kernels/moe.h), given on the host-counted slots: c[e] =
// alpha E f_e / T (f32, as the CPU rounds it) and coef[e] = the same in double. One thread a row
// for the scores (into p_buf [T, E]) and d_logits += (each gradient finished before it is added);
// one thread an expert for its probability mass in row order (double); one thread for the loss.
void moe_aux_loss(cudaStream_t stream, const float* logits, int64_t T, int64_t E, bool sigmoid,
                  const float* c, const double* coef, float* p_buf, float* s_buf, double* mass,
                  float* loss, float* d_logits);

}  // namespace loom::cuda::launch

namespace loom::cuda::launch {

// kda_recurrent_backward (kernels/kda_backward.h): the CPU's segment replay, one block per value
// head. Thread x walks column x of the [dk, dv] state for the sums over rows and row x for the
// sums over columns; the state, its replays and its gradient live in per-head global scratch
// (kda_backward_scratch_floats). dq_heads, dk_heads: [Hv, T, dk] scratch (each head's share),
// then summed per key head in head order. Head dims up to kKdaBackwardMaxDim.
inline constexpr int64_t kKdaBackwardMaxDim = 1024;
int64_t kda_backward_scratch_floats(int64_t T, int64_t Hv, int64_t dk, int64_t dv);
struct KdaBackwardArgs {
  // d_final may be null; so may s0 (zero states) in the chunked backward's packed batch.
  const float *q, *k, *v, *g, *beta, *s0, *d_out, *d_final;
  float scale;
  int64_t T, Hk, Hv, dk, dv;
  bool scalar_g;
  float *dq, *dk_out, *dv_out, *dg, *dbeta, *d_s0;  // d_s0 may be null
  float* scratch;  // kda_backward_scratch_floats(T, Hv, dk, dv) floats
  // The chunked backward's packed batch (the recurrent one takes one sequence): null for one
  // sequence of T rows; else i64 [num_seqs + 1] row offsets on the device, each sequence with its
  // own [Hv, dk, dv] states in s0, d_final and d_s0, and max_T >= every sequence's length.
  const int64_t* cu_seqlens = nullptr;
  int64_t num_seqs = 1, max_T = 0;
};
void kda_recurrent_backward(cudaStream_t stream, const KdaBackwardArgs& a);

}  // namespace loom::cuda::launch
