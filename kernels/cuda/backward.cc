// Host side of the CUDA backward kernels (kernels/cuda/backward.h): device checks, temporaries,
// launches. The dispatchers in kernels/ have checked shapes, dtypes and aliasing already.
#include "kernels/cuda/backward.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "kernels/cuda/activation.h"
#include "kernels/cuda/attention_train_launch.h"
#include "kernels/cuda/backward_launch.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/kda_chunked_backward.h"
#include "kernels/cuda/kda_chunked_backward_launch.h"

namespace loom::cuda {
namespace {

const float* f(const Tensor& t) { return static_cast<const float*>(t.raw()); }
float* fm(const Tensor& t) { return static_cast<float*>(t.raw()); }

void check_args(const char* fn, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) check_on_device(fn, "tensor", *t);
}

// An i32 device (or host) tensor's values on the host.
std::vector<int32_t> read_i32(const Exec& ex, const Tensor& t) {
  std::vector<int32_t> out(static_cast<size_t>(t.numel()));
  if (out.empty()) return out;
  if (t.device().is_cpu()) {
    std::copy_n(t.data<int32_t>(), out.size(), out.data());
  } else {
    LOOM_CUDA_CHECK(
        cudaMemcpyAsync(out.data(), t.raw(), t.nbytes(), cudaMemcpyDeviceToHost, stream_of(ex)));
    LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_of(ex)));
  }
  return out;
}

void check_range(const char* op, const char* what, const std::vector<int32_t>& v, int64_t lo,
                 int64_t hi) {
  for (size_t j = 0; j < v.size(); ++j) {
    LOOM_CHECK(v[j] >= lo && v[j] < hi, "%s: %s[%lld] = %d outside [%lld, %lld)", op, what,
               static_cast<long long>(j), v[j], static_cast<long long>(lo),
               static_cast<long long>(hi));
  }
}

}  // namespace

void rmsnorm_backward(const Exec& ex, const Tensor& x, const Tensor& w, float eps,
                      float weight_offset, const Tensor& dout, const Tensor& dx, const Tensor& dw) {
  check_args("rmsnorm_backward", {&x, &w, &dout, &dx, &dw});
  const int64_t d = x.dim(-1);
  const int64_t n = d > 0 ? x.numel() / d : 0;
  if (n == 0 || d == 0) return;
  cudaStream_t s = stream_of(ex);
  const int64_t chunks = (n + launch::kColumnSumRows - 1) / launch::kColumnSumRows;
  Scratch rstd(static_cast<size_t>(n) * sizeof(float), s);
  Scratch partials(static_cast<size_t>(chunks * d) * sizeof(float), s);
  float* rs = static_cast<float*>(rstd.get());
  launch::row_rstd(s, f(x), n, d, eps, rs);
  // dw reads x and dout before dx (which may alias either) is written.
  launch::column_sums(s, f(dout), f(x), rs, n, d, static_cast<float*>(partials.get()), fm(dw));
  launch::rmsnorm_dx(s, f(x), f(w), weight_offset, f(dout), rs, n, d, fm(dx));
}

void l2norm_backward(const Exec& ex, const Tensor& x, float eps, float scale, const Tensor& dout,
                     const Tensor& dx) {
  check_args("l2norm_backward", {&x, &dout, &dx});
  const int64_t d = x.dim(-1);
  const int64_t n = d > 0 ? x.numel() / d : 0;
  launch::l2norm_dx(stream_of(ex), f(x), f(dout), n, d, eps, scale, fm(dx));
}

void silu_mul_backward(const Exec& ex, const Tensor& gate, const Tensor& up, const Tensor& dout,
                       const Tensor& dgate, const Tensor& dup) {
  check_args("silu_mul_backward", {&gate, &up, &dout, &dgate, &dup});
  launch::gate_backward(stream_of(ex), launch::GateGrad::kSiluMul, f(gate), f(up), f(dout),
                        gate.numel(), fm(dgate), fm(dup));
}

void add_bias_backward(const Exec& ex, const Tensor& dx, const Tensor& dbias) {
  check_args("add_bias_backward", {&dx, &dbias});
  const int64_t n = dx.dim(0), c = dx.dim(1);
  if (n == 0 || c == 0) return;
  cudaStream_t s = stream_of(ex);
  const int64_t chunks = (n + launch::kColumnSumRows - 1) / launch::kColumnSumRows;
  Scratch partials(static_cast<size_t>(chunks * c) * sizeof(float), s);
  launch::column_sums(s, f(dx), nullptr, nullptr, n, c, static_cast<float*>(partials.get()),
                      fm(dbias));
}

void mul_sigmoid_backward(const Exec& ex, const Tensor& x, const Tensor& gate, const Tensor& dout,
                          const Tensor& dx, const Tensor& dgate) {
  check_args("mul_sigmoid_backward", {&x, &gate, &dout, &dx, &dgate});
  launch::gate_backward(stream_of(ex), launch::GateGrad::kMulSigmoid, f(x), f(gate), f(dout),
                        x.numel(), fm(dx), fm(dgate));
}

void mul_silu_backward(const Exec& ex, const Tensor& x, const Tensor& gate, const Tensor& dout,
                       const Tensor& dx, const Tensor& dgate) {
  check_args("mul_silu_backward", {&x, &gate, &dout, &dx, &dgate});
  launch::gate_backward(stream_of(ex), launch::GateGrad::kMulSilu, f(x), f(gate), f(dout),
                        x.numel(), fm(dx), fm(dgate));
}

void mul_sigmoid_rows_backward(const Exec& ex, const Tensor& x, const Tensor& gate,
                               const Tensor& dout, const Tensor& dx, const Tensor& dgate) {
  check_args("mul_sigmoid_rows_backward", {&x, &gate, &dout, &dx, &dgate});
  launch::mul_sigmoid_rows_backward(stream_of(ex), f(x), f(gate), f(dout), x.dim(0), x.dim(1),
                                    fm(dx), fm(dgate));
}

void sigmoid_backward(const Exec& ex, const Tensor& y, const Tensor& dout, const Tensor& dx) {
  check_args("sigmoid_backward", {&y, &dout, &dx});
  launch::sigmoid_backward(stream_of(ex), f(y), f(dout), y.numel(), fm(dx));
}

namespace {

// A packed batch's offsets on the device: i64 [B + 1]. Their values stay there (the kernels trust
// them, as the callers' contracts say); the CPU twins check them.
int64_t checked_num_seqs(const char* op, const Tensor& cu_seqlens) {
  check_on_device(op, "cu_seqlens", cu_seqlens);
  LOOM_CHECK(cu_seqlens.dtype() == DType::kI64 && cu_seqlens.ndim() == 1 &&
                 cu_seqlens.dim(0) >= 1 && cu_seqlens.is_contiguous(),
             "%s (CUDA): cu_seqlens %s, expected contiguous i64 [B + 1]", op,
             cu_seqlens.describe().c_str());
  return cu_seqlens.dim(0) - 1;
}

// causal_conv1d_backward's launch: one sequence (cu_seqlens undefined; the states optional) or a
// packed batch of zero-state sequences.
void launch_conv_backward(const Exec& ex, const Tensor& x, const Tensor& weight,
                          const Tensor& initial_state, bool apply_silu, const Tensor& dout,
                          const Tensor& dfinal_state, const Tensor& dx, const Tensor& dweight,
                          const Tensor& dinitial_state, const Tensor& cu_seqlens) {
  launch::ConvBackwardArgs a{};
  a.T = x.dim(0);
  a.C = x.dim(1);
  a.W = weight.dim(1);
  if (a.C == 0) return;
  cudaStream_t s = stream_of(ex);
  const int64_t chunks = (a.T + launch::kColumnSumRows - 1) / launch::kColumnSumRows;
  Scratch dpre(static_cast<size_t>(a.T * a.C) * sizeof(float), s);
  Scratch partials(static_cast<size_t>(chunks * a.C * a.W) * sizeof(float), s);
  a.x = f(x);
  a.weight = f(weight);
  a.s0 = initial_state.defined() ? f(initial_state) : nullptr;
  a.dout = f(dout);
  a.dfin = dfinal_state.defined() ? f(dfinal_state) : nullptr;
  a.dx = fm(dx);
  a.dweight = fm(dweight);
  a.ds0 = dinitial_state.defined() ? fm(dinitial_state) : nullptr;
  a.dpre = static_cast<float*>(dpre.get());
  a.partials = static_cast<float*>(partials.get());
  a.silu = apply_silu;
  if (cu_seqlens.defined()) {
    a.cu = cu_seqlens.data<int64_t>();
    a.num_seqs = cu_seqlens.dim(0) - 1;
  }
  launch::causal_conv1d_backward(s, a);
}

}  // namespace

void causal_conv1d_backward(const Exec& ex, const Tensor& x, const Tensor& weight,
                            const Tensor& initial_state, bool apply_silu, const Tensor& dout,
                            const Tensor& dfinal_state, const Tensor& dx, const Tensor& dweight,
                            const Tensor& dinitial_state) {
  check_args("causal_conv1d_backward", {&x, &weight, &dout, &dx, &dweight});
  for (const Tensor* t : {&initial_state, &dfinal_state, &dinitial_state})
    if (t->defined()) check_on_device("causal_conv1d_backward", "state", *t);
  launch_conv_backward(ex, x, weight, initial_state, apply_silu, dout, dfinal_state, dx, dweight,
                       dinitial_state, Tensor());
}

void causal_conv1d_varlen_backward(const Exec& ex, const Tensor& x, const Tensor& weight,
                                   const Tensor& cu_seqlens, bool apply_silu, const Tensor& dout,
                                   const Tensor& dx, const Tensor& dweight) {
  static constexpr const char* kOp = "causal_conv1d_varlen_backward";
  check_args(kOp, {&x, &weight, &dout, &dx, &dweight});
  checked_num_seqs(kOp, cu_seqlens);
  launch_conv_backward(ex, x, weight, Tensor(), apply_silu, dout, Tensor(), dx, dweight, Tensor(),
                       cu_seqlens);
}

namespace {

// The recurrent and chunked delta-rule backwards take the same arguments (one contract).
launch::KdaBackwardArgs kda_backward_args(const Tensor& q, const Tensor& k, const Tensor& v,
                                          const Tensor& g, const Tensor& beta, float scale,
                                          const Tensor& initial_state, const Tensor& d_out,
                                          const Tensor& d_final_state, const Tensor& dq,
                                          const Tensor& dk, const Tensor& dv, const Tensor& dg,
                                          const Tensor& dbeta, const Tensor& d_initial_state) {
  launch::KdaBackwardArgs a{};
  a.T = q.dim(0);
  a.Hk = q.dim(1);
  a.dk = q.dim(2);
  a.Hv = v.dim(1);
  a.dv = v.dim(2);
  a.scalar_g = g.dim(2) == 1;
  a.q = f(q);
  a.k = f(k);
  a.v = f(v);
  a.g = f(g);
  a.beta = f(beta);
  a.s0 = initial_state.defined() ? f(initial_state) : nullptr;
  a.d_out = f(d_out);
  a.d_final = d_final_state.defined() ? f(d_final_state) : nullptr;
  a.scale = scale;
  a.dq = fm(dq);
  a.dk_out = fm(dk);
  a.dv_out = fm(dv);
  a.dg = fm(dg);
  a.dbeta = fm(dbeta);
  a.d_s0 = d_initial_state.defined() ? fm(d_initial_state) : nullptr;
  return a;
}

}  // namespace

void kda_recurrent_backward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& g, const Tensor& beta, float scale,
                            const Tensor& initial_state, const Tensor& d_out,
                            const Tensor& d_final_state, const Tensor& dq, const Tensor& dk,
                            const Tensor& dv, const Tensor& dg, const Tensor& dbeta,
                            const Tensor& d_initial_state) {
  static constexpr const char* kOp = "kda_recurrent_backward";
  check_args(kOp, {&q, &k, &v, &g, &beta, &initial_state, &d_out, &dq, &dk, &dv, &dg, &dbeta});
  if (d_final_state.defined()) check_args(kOp, {&d_final_state});
  if (d_initial_state.defined()) check_args(kOp, {&d_initial_state});
  launch::KdaBackwardArgs a =
      kda_backward_args(q, k, v, g, beta, scale, initial_state, d_out, d_final_state, dq, dk, dv,
                        dg, dbeta, d_initial_state);
  LOOM_CHECK(a.dk <= launch::kKdaBackwardMaxDim && a.dv <= launch::kKdaBackwardMaxDim,
             "%s (CUDA): head dims %lld x %lld; this kernel takes up to %lld", kOp,
             static_cast<long long>(a.dk), static_cast<long long>(a.dv),
             static_cast<long long>(launch::kKdaBackwardMaxDim));
  Scratch scratch(static_cast<size_t>(launch::kda_backward_scratch_floats(a.T, a.Hv, a.dk, a.dv)) *
                      sizeof(float),
                  stream_of(ex));
  a.scratch = static_cast<float*>(scratch.get());
  launch::kda_recurrent_backward(stream_of(ex), a);
}

void kda_chunked_backward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& g, const Tensor& beta, float scale,
                          const Tensor& initial_state, const Tensor& d_out,
                          const Tensor& d_final_state, const Tensor& dq, const Tensor& dk,
                          const Tensor& dv, const Tensor& dg, const Tensor& dbeta,
                          const Tensor& d_initial_state) {
  static constexpr const char* kOp = "kda_chunked_backward";
  for (const Tensor* t : {&q, &k, &v, &g, &beta, &initial_state, &d_out, &dq, &dk, &dv, &dg, &dbeta,
                          &d_final_state, &d_initial_state}) {
    if (!t->defined()) continue;  // only the two optional states may be
    check_on_device(kOp, "tensor", *t);
    LOOM_CHECK(t->is_contiguous(), "%s (CUDA): %s is not contiguous", kOp, t->describe().c_str());
  }
  launch::KdaBackwardArgs a =
      kda_backward_args(q, k, v, g, beta, scale, initial_state, d_out, d_final_state, dq, dk, dv,
                        dg, dbeta, d_initial_state);
  LOOM_CHECK(a.Hv <= 65535, "%s (CUDA): %lld value heads; one block each, at most 65535", kOp,
             static_cast<long long>(a.Hv));
  cudaStream_t s = stream_of(ex);
  a.num_seqs = 1;
  a.max_T = a.T;
  Scratch scratch(
      static_cast<size_t>(launch::kda_chunked_backward_scratch_floats(a)) * sizeof(float), s);
  a.scratch = static_cast<float*>(scratch.get());
  launch::kda_chunked_backward(s, a);
}

void kda_chunked_varlen_backward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& g, const Tensor& beta, float scale,
                                 const Tensor& cu_seqlens, int64_t max_seqlen, const Tensor& d_out,
                                 const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                 const Tensor& dg, const Tensor& dbeta) {
  static constexpr const char* kOp = "kda_varlen_backward";
  for (const Tensor* t : {&q, &k, &v, &g, &beta, &d_out, &dq, &dk, &dv, &dg, &dbeta}) {
    check_on_device(kOp, "tensor", *t);
    LOOM_CHECK(t->is_contiguous(), "%s (CUDA): %s is not contiguous", kOp, t->describe().c_str());
  }
  launch::KdaBackwardArgs a = kda_backward_args(q, k, v, g, beta, scale, Tensor(), d_out, Tensor(),
                                                dq, dk, dv, dg, dbeta, Tensor());
  a.cu_seqlens = cu_seqlens.data<int64_t>();
  a.num_seqs = checked_num_seqs(kOp, cu_seqlens);
  a.max_T = max_seqlen;
  LOOM_CHECK(a.Hv <= 65535 && a.num_seqs <= 65535,
             "%s (CUDA): %lld value heads x %lld sequences; one block each, at most 65535 of each",
             kOp, static_cast<long long>(a.Hv), static_cast<long long>(a.num_seqs));
  cudaStream_t s = stream_of(ex);
  Scratch scratch(
      static_cast<size_t>(launch::kda_chunked_backward_scratch_floats(a)) * sizeof(float), s);
  a.scratch = static_cast<float*>(scratch.get());
  launch::kda_chunked_backward(s, a);
}

// Elementwise gradients into d_f and a scratch d_A_log per element; the parameter gradients are
// column sums over tokens in fixed chunks (as column_sums), then d_A_log's columns head by head.
void kda_gate_backward(const Exec& ex, const Tensor& gate_in, const Tensor& A_log,
                       const Tensor& dt_bias, float lower_bound, const Tensor& d_g,
                       const Tensor& d_f, const Tensor& d_A_log, const Tensor& d_dt_bias) {
  check_args("kda_gate_backward", {&gate_in, &A_log, &d_g, &d_f, &d_A_log});
  if (dt_bias.defined()) check_args("kda_gate_backward", {&dt_bias, &d_dt_bias});
  const int64_t T = gate_in.dim(0), width = gate_in.dim(1), H = A_log.numel();
  if (T == 0 || width == 0) return;
  cudaStream_t s = stream_of(ex);
  const int64_t chunks = (T + launch::kColumnSumRows - 1) / launch::kColumnSumRows;
  Scratch d_alog(static_cast<size_t>(T * width) * sizeof(float), s);
  Scratch da_col(static_cast<size_t>(width) * sizeof(float), s);
  Scratch partials(static_cast<size_t>(chunks * width) * sizeof(float), s);
  float* dal = static_cast<float*>(d_alog.get());
  float* cols = static_cast<float*>(da_col.get());
  float* part = static_cast<float*>(partials.get());
  launch::kda_gate_grads(s, f(gate_in), f(A_log), dt_bias.defined() ? f(dt_bias) : nullptr,
                         lower_bound, f(d_g), T, width, H, fm(d_f), dal);
  if (dt_bias.defined())
    launch::column_sums(s, f(d_f), nullptr, nullptr, T, width, part, fm(d_dt_bias));
  LOOM_CUDA_CHECK(cudaMemsetAsync(cols, 0, static_cast<size_t>(width) * sizeof(float), s));
  launch::column_sums(s, dal, nullptr, nullptr, T, width, part, cols);
  launch::group_sums(s, cols, H, width / H, fm(d_A_log));
}

void attnres_aggregate_backward(const Exec& ex, const Tensor& sources, const Tensor& query,
                                const Tensor& key_norm, const Tensor& out_norm, float eps,
                                const Tensor& dout, const Tensor& dsources, const Tensor& dquery,
                                const Tensor& dkey_norm, const Tensor& dout_norm) {
  check_args("attnres_aggregate_backward", {&sources, &query, &key_norm, &out_norm, &dout,
                                            &dsources, &dquery, &dkey_norm, &dout_norm});
  LOOM_CHECK(sources.dtype() == DType::kF32,
             "attnres_aggregate_backward: sources %s: the backward is f32 only",
             sources.describe().c_str());
  const int64_t S = sources.dim(0), N = sources.dim(1), D = sources.dim(2);
  if (N == 0 || D == 0) return;
  const int64_t blocks = (N + launch::kAttnResTokenBlock - 1) / launch::kAttnResTokenBlock;
  Scratch partials(static_cast<size_t>(blocks * 3 * D) * sizeof(float), stream_of(ex));
  launch::attnres_backward(stream_of(ex), f(sources), f(query), f(key_norm), f(out_norm), eps,
                           f(dout), S, N, D, fm(dsources), static_cast<float*>(partials.get()),
                           fm(dquery), fm(dkey_norm), fm(dout_norm));
}

namespace {
void check_attention_limits(const char* op, int64_t T, int64_t d, int64_t dv) {
  if (launch::attention_tiled_supported(d, dv)) return;  // tiled: no length limit
  LOOM_CHECK(
      T <= launch::kAttnMaxTrainLen && d <= launch::kAttnMaxHeadDim &&
          dv <= launch::kAttnMaxHeadDim,
      "%s (CUDA): %lld tokens with head dims %lld / %lld; beyond the tiled kernels' head dims "
      "(192 / 128) this kernel keeps a query's scores in shared memory and takes at most %lld "
      "tokens and head dims of %lld",
      op, static_cast<long long>(T), static_cast<long long>(d), static_cast<long long>(dv),
      static_cast<long long>(launch::kAttnMaxTrainLen),
      static_cast<long long>(launch::kAttnMaxHeadDim));
}
}  // namespace

void causal_attention_forward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                              float scale, const Tensor& out, const Tensor& lse) {
  check_args("causal_attention_forward", {&q, &k, &v, &out, &lse});
  const int64_t T = q.dim(0), Hq = q.dim(1), Hkv = k.dim(1), d = q.dim(2), dv = v.dim(2);
  check_attention_limits("causal_attention_forward", T, d, dv);
  launch::causal_attention_forward(stream_of(ex), f(q), f(k), f(v), scale, T, Hq, Hkv, d, dv,
                                   fm(out), fm(lse));
}

void causal_attention_backward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& out, const Tensor& lse, const Tensor& d_out,
                               float scale, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  check_args("causal_attention_backward", {&q, &k, &v, &out, &lse, &d_out, &dq, &dk, &dv});
  const int64_t T = q.dim(0), Hq = q.dim(1), Hkv = k.dim(1), d = q.dim(2), w = v.dim(2);
  check_attention_limits("causal_attention_backward", T, d, w);
  if (T == 0 || Hq == 0) return;
  Scratch d_rows(static_cast<size_t>(T * Hq) * sizeof(float), stream_of(ex));
  launch::causal_attention_backward(stream_of(ex), f(q), f(k), f(v), f(out), f(lse), f(d_out),
                                    scale, T, Hq, Hkv, d, w, static_cast<float*>(d_rows.get()),
                                    fm(dq), fm(dk), fm(dv));
}

void causal_attention_varlen_forward(const Exec& ex, const Tensor& q, const Tensor& k,
                                     const Tensor& v, const Tensor& cu_seqlens, int64_t max_seqlen,
                                     float scale, const Tensor& out, const Tensor& lse) {
  static constexpr const char* kOp = "causal_attention_varlen_forward";
  check_args(kOp, {&q, &k, &v, &out, &lse});
  const int64_t nseq = checked_num_seqs(kOp, cu_seqlens);
  const int64_t T = q.dim(0), Hq = q.dim(1), Hkv = k.dim(1), d = q.dim(2), dv = v.dim(2);
  check_attention_limits(kOp, max_seqlen, d, dv);
  launch::causal_attention_forward(stream_of(ex), f(q), f(k), f(v), scale, T, Hq, Hkv, d, dv,
                                   fm(out), fm(lse), cu_seqlens.data<int64_t>(), nseq, max_seqlen);
}

void causal_attention_varlen_backward(const Exec& ex, const Tensor& q, const Tensor& k,
                                      const Tensor& v, const Tensor& cu_seqlens, int64_t max_seqlen,
                                      const Tensor& out, const Tensor& lse, const Tensor& d_out,
                                      float scale, const Tensor& dq, const Tensor& dk,
                                      const Tensor& dv) {
  static constexpr const char* kOp = "causal_attention_varlen_backward";
  check_args(kOp, {&q, &k, &v, &out, &lse, &d_out, &dq, &dk, &dv});
  const int64_t nseq = checked_num_seqs(kOp, cu_seqlens);
  const int64_t T = q.dim(0), Hq = q.dim(1), Hkv = k.dim(1), d = q.dim(2), w = v.dim(2);
  check_attention_limits(kOp, max_seqlen, d, w);
  if (T == 0 || Hq == 0) return;
  Scratch d_rows(static_cast<size_t>(T * Hq) * sizeof(float), stream_of(ex));
  launch::causal_attention_backward(stream_of(ex), f(q), f(k), f(v), f(out), f(lse), f(d_out),
                                    scale, T, Hq, Hkv, d, w, static_cast<float*>(d_rows.get()),
                                    fm(dq), fm(dk), fm(dv), cu_seqlens.data<int64_t>(), nseq,
                                    max_seqlen);
}

void moe_route_backward(const Exec& ex, const Tensor& logits, const Tensor& expert_ids,
                        const RouterParams& params, const Tensor& d_weights,
                        const Tensor& d_logits) {
  static constexpr const char* kOp = "moe_route_backward";
  check_args(kOp, {&logits, &expert_ids, &d_weights, &d_logits});
  const int64_t T = logits.dim(0), E = logits.dim(1), K = params.top_k;
  check_range(kOp, "expert_ids", read_i32(ex, expert_ids), 0, E);
  if (T == 0) return;
  cudaStream_t s = stream_of(ex);
  Scratch sc(static_cast<size_t>(2 * T * E) * sizeof(float), s);
  float* sp = static_cast<float*>(sc.get());
  launch::moe_route_backward(s, f(logits), expert_ids.data<int32_t>(), f(d_weights), T, E, K,
                             params.score == RouterScore::kSigmoid, params.renormalize,
                             params.routed_scaling, sp, sp + T * E, fm(d_logits));
}

void moe_aux_loss_forward_backward(const Exec& ex, const Tensor& logits, const Tensor& expert_ids,
                                   RouterScore score, float alpha, const Tensor& loss,
                                   const Tensor& d_logits) {
  static constexpr const char* kOp = "moe_aux_loss_forward_backward";
  check_args(kOp, {&logits, &expert_ids, &loss, &d_logits});
  const int64_t T = logits.dim(0), E = logits.dim(1);
  const std::vector<int32_t> ids = read_i32(ex, expert_ids);
  check_range(kOp, "expert_ids", ids, 0, E);
  // The CPU's coefficients: dL/dp[t, e] = alpha E f_e / T, rounded to f32 for the gradient.
  std::vector<int64_t> count(static_cast<size_t>(E), 0);
  for (int32_t id : ids) ++count[id];
  const double scale =
      T > 0 ? static_cast<double>(alpha) * E / (static_cast<double>(ids.size()) * T) : 0.0;
  std::vector<double> coef(static_cast<size_t>(E));
  std::vector<float> c(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    coef[e] = scale * static_cast<double>(count[e]);
    c[e] = static_cast<float>(coef[e]);
  }
  cudaStream_t s = stream_of(ex);
  // coef [E] and mass [E] doubles, then c [E] floats, then the scores' scratch (two [T, E]).
  const size_t doubles = static_cast<size_t>(2 * E) * sizeof(double);
  Scratch buf(doubles + static_cast<size_t>(E + 2 * T * E) * sizeof(float), s);
  double* coef_d = static_cast<double*>(buf.get());
  double* mass = coef_d + E;
  float* c_d = reinterpret_cast<float*>(static_cast<char*>(buf.get()) + doubles);
  LOOM_CUDA_CHECK(cudaMemcpyAsync(coef_d, coef.data(), static_cast<size_t>(E) * sizeof(double),
                                  cudaMemcpyHostToDevice, s));
  LOOM_CUDA_CHECK(cudaMemcpyAsync(c_d, c.data(), static_cast<size_t>(E) * sizeof(float),
                                  cudaMemcpyHostToDevice, s));
  // The host vectors live until the copies have run: pageable copies are staged before return.
  launch::moe_aux_loss(s, f(logits), T, E, score == RouterScore::kSigmoid, c_d, coef_d, c_d + E,
                       c_d + E + T * E, mass, fm(loss), fm(d_logits));
}

void moe_permute_backward(const Exec& ex, const Tensor& d_x_sorted, const Tensor& row_of_slot,
                          const Tensor& d_x) {
  static constexpr const char* kOp = "moe_permute_backward";
  check_args(kOp, {&d_x_sorted, &row_of_slot, &d_x});
  check_range(kOp, "row_of_slot", read_i32(ex, row_of_slot), -1, d_x_sorted.dim(0));
  launch::moe_permute_backward(stream_of(ex), f(d_x_sorted), row_of_slot.data<int32_t>(),
                               d_x.dim(0), row_of_slot.dim(1), d_x.dim(1), fm(d_x));
}

void moe_unpermute_combine_backward(const Exec& ex, const Tensor& y, const Tensor& row_of_slot,
                                    const Tensor& weights, const Tensor& d_out, const Tensor& d_y,
                                    const Tensor& d_weights) {
  static constexpr const char* kOp = "moe_unpermute_combine_backward";
  check_args(kOp, {&y, &row_of_slot, &weights, &d_out, &d_y, &d_weights});
  const std::vector<int32_t> rows = read_i32(ex, row_of_slot);
  check_range(kOp, "row_of_slot", rows, -1, y.dim(0));
  // Distinct rows (moe_permute's): two slots writing one row of d_y would race.
  std::vector<int32_t> owned;
  for (int32_t r : rows)
    if (r >= 0) owned.push_back(r);
  std::sort(owned.begin(), owned.end());
  LOOM_CHECK(std::adjacent_find(owned.begin(), owned.end()) == owned.end(),
             "%s: row_of_slot names a row twice", kOp);
  launch::moe_unpermute_combine_backward(stream_of(ex), f(y), row_of_slot.data<int32_t>(),
                                         f(weights), f(d_out), d_out.dim(0), row_of_slot.dim(1),
                                         d_out.dim(1), fm(d_y), fm(d_weights));
}

void moe_grouped_swiglu_backward(const Exec& ex, const Tensor& x, const Tensor& offsets,
                                 const Tensor& w_gate, const Tensor& w_up, const Tensor& w_down,
                                 const Tensor& gate_up, const Tensor& d_y, const Tensor& d_x,
                                 const Tensor& d_w_gate, const Tensor& d_w_up,
                                 const Tensor& d_w_down) {
  static constexpr const char* kOp = "moe_grouped_swiglu_backward";
  check_args(kOp,
             {&x, &offsets, &w_gate, &w_up, &w_down, &d_y, &d_x, &d_w_gate, &d_w_up, &d_w_down});
  const int64_t r = x.dim(0);
  const int64_t ne = w_gate.dim(0), inter = w_gate.dim(1);
  const std::vector<int32_t> off = read_i32(ex, offsets);
  LOOM_CHECK(off[0] == 0, "%s: offsets[0] = %d, expected 0", kOp, off[0]);
  int64_t max_rows = 0;
  for (int64_t e = 0; e < ne; ++e) {
    LOOM_CHECK(off[e + 1] >= off[e] && off[e + 1] <= r,
               "%s: offsets[%lld .. %lld] = %d, %d: decreasing or past %lld rows", kOp,
               static_cast<long long>(e), static_cast<long long>(e + 1), off[e], off[e + 1],
               static_cast<long long>(r));
    max_rows = std::max<int64_t>(max_rows, off[e + 1] - off[e]);
  }
  if (max_rows == 0) return;
  const bool kept = gate_up.defined();
  // g, u (recomputed unless kept), h = silu(g) * u, dg (first d_h) and du: max_rows x I each.
  const Tensor buf = Tensor::empty({5, max_rows, inter}, DType::kF32, ex.device);
  for (int64_t e = 0; e < ne; ++e) {
    const int64_t b = off[e], n = off[e + 1] - off[e];
    if (n == 0) continue;
    const Tensor xe = x.slice(0, b, b + n), dye = d_y.slice(0, b, b + n),
                 dxe = d_x.slice(0, b, b + n);
    const Tensor wg = w_gate.select(e), wu = w_up.select(e), wd = w_down.select(e);
    const Tensor dwg = d_w_gate.select(e), dwu = d_w_up.select(e), dwd = d_w_down.select(e);
    const Tensor ge = kept ? gate_up.select(0).slice(0, b, b + n) : buf.select(0).slice(0, 0, n);
    const Tensor ue = kept ? gate_up.select(1).slice(0, b, b + n) : buf.select(1).slice(0, 0, n);
    const Tensor h = buf.select(2).slice(0, 0, n), dg = buf.select(3).slice(0, 0, n),
                 du = buf.select(4).slice(0, 0, n);
    if (!kept) {
      linear_forward(ex, xe, wg, ge, 0.0f);
      linear_forward(ex, xe, wu, ue, 0.0f);
    }
    silu_mul_forward(ex, ge, ue, h);
    matmul(ex, dye, false, wd, false, dg, 1.0f, 0.0f);  // d_h = d_ye @ Wd
    matmul(ex, dye, true, h, false, dwd, 1.0f, 1.0f);   // d_Wd += d_ye^T @ h
    silu_mul_backward(ex, ge, ue, dg, dg, du);          // (dg, du) from d_h
    matmul(ex, dg, false, wg, false, dxe, 1.0f, 0.0f);  // d_xe = dg @ Wg
    matmul(ex, du, false, wu, false, dxe, 1.0f, 1.0f);  //      + du @ Wu
    matmul(ex, dg, true, xe, false, dwg, 1.0f, 1.0f);   // d_Wg += dg^T @ xe
    matmul(ex, du, true, xe, false, dwu, 1.0f, 1.0f);   // d_Wu += du^T @ xe
  }
}

void scatter_add_rows(const Exec& ex, const char* op, const Tensor& src, const Tensor& ids,
                      const Tensor& dst) {
  check_args(op, {&src, &dst});
  const int64_t n = src.dim(0), c = src.dim(1), rows = dst.dim(0);
  if (n == 0) return;
  cudaStream_t s = stream_of(ex);
  // The ids come to the host (they are checked there, and sorted there: a trainer's step has a
  // few thousand of them).
  std::vector<int64_t> id(static_cast<size_t>(n));
  const bool i32 = ids.dtype() == DType::kI32;
  std::vector<int32_t> id32(i32 ? static_cast<size_t>(n) : 0);
  void* host = i32 ? static_cast<void*>(id32.data()) : static_cast<void*>(id.data());
  if (ids.device().is_cpu()) {
    std::copy_n(static_cast<const char*>(ids.raw()), ids.nbytes(), static_cast<char*>(host));
  } else {
    LOOM_CUDA_CHECK(cudaMemcpyAsync(host, ids.raw(), ids.nbytes(), cudaMemcpyDeviceToHost, s));
    LOOM_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  if (i32) std::copy(id32.begin(), id32.end(), id.begin());
  for (int64_t i = 0; i < n; ++i) {
    LOOM_CHECK(id[i] >= 0 && id[i] < rows, "%s: ids[%lld] = %lld outside [0, %lld)", op,
               static_cast<long long>(i), static_cast<long long>(id[i]),
               static_cast<long long>(rows));
  }
  if (c == 0) return;
  // Sources stably sorted by target row, cut into one segment per target row.
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  std::stable_sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) { return id[a] < id[b]; });
  std::vector<int64_t> seg_begin, seg_row;
  for (int64_t k = 0; k < n; ++k) {
    if (k == 0 || id[perm[k]] != id[perm[k - 1]]) {
      seg_begin.push_back(k);
      seg_row.push_back(id[perm[k]]);
    }
  }
  const int64_t segments = static_cast<int64_t>(seg_row.size());
  seg_begin.push_back(n);
  std::vector<int64_t> packed;  // perm, seg_begin, seg_row in one upload
  packed.reserve(perm.size() + seg_begin.size() + seg_row.size());
  packed.insert(packed.end(), perm.begin(), perm.end());
  packed.insert(packed.end(), seg_begin.begin(), seg_begin.end());
  packed.insert(packed.end(), seg_row.begin(), seg_row.end());
  Scratch dev(packed.size() * sizeof(int64_t), s);
  dev.upload(packed.data(), packed.size() * sizeof(int64_t));
  const int64_t* p = static_cast<const int64_t*>(dev.get());
  launch::scatter_add_segments(s, f(src), p, p + n, p + n + segments + 1, segments, c, fm(dst));
}

}  // namespace loom::cuda
