// Kimi Delta Attention mixer (MODELS.md, "KDA"): fused q|k|v projection, one short convolution
// over q|k|v with SiLU, L2-normalised q and k, per-channel decay gate, delta-rule recurrence
// (chunked for prefill, token by token for decode), gated per-head RMSNorm, output projection.

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "engine/model/layers.h"
#include "engine/model/linear_attention.h"
#include "kernels/activation.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/gemm_backward.h"
#include "kernels/kda.h"
#include "kernels/kda_backward.h"
#include "kernels/norm.h"
#include "kernels/side_stream.h"

namespace loom {
namespace {

class KdaMixer final : public Mixer {
 public:
  KdaMixer(const ModelConfig& cfg) : cfg_(cfg.linear), eps_(cfg.rms_norm_eps) {}

  absl::Status load(const ModelConfig& cfg, const WeightLoader& w, int layer) {
    const int64_t d = cfg.hidden_size;
    const int64_t hk = cfg_.num_heads, hv = cfg_.num_v_heads, dk = cfg_.head_dim,
                  dv = cfg_.v_head_dim;
    ck_ = hk * dk;
    cv_ = hv * dv;
    const std::string p = absl::StrCat("layers.", layer, ".kda.");
    // `get`: f32 parameters; `mat`: GEMM matrices, in the placement's dtype.
    auto get = [&](const char* name, Shape s, Tensor* t) -> absl::Status {
      LOOM_ASSIGN_OR_RETURN(*t, w.load(p + name, s));
      return absl::OkStatus();
    };
    auto mat = [&](const char* name, Shape s, Tensor* t) -> absl::Status {
      LOOM_ASSIGN_OR_RETURN(*t, w.load_matrix(p + name, s));
      return absl::OkStatus();
    };
    LOOM_RETURN_IF_ERROR(mat("qkv_proj.weight", {2 * ck_ + cv_, d}, &qkv_proj_));
    LOOM_RETURN_IF_ERROR(get("conv.weight", {2 * ck_ + cv_, cfg_.conv_kernel}, &conv_));
    rank_ = cfg_.gate_rank > 0 ? cfg_.gate_rank : dk;
    LOOM_RETURN_IF_ERROR(mat("f_a.weight", {rank_, d}, &f_a_));
    LOOM_RETURN_IF_ERROR(mat("f_b.weight", {hv * dk, rank_}, &f_b_));
    LOOM_RETURN_IF_ERROR(get("dt_bias", {hv * dk}, &dt_bias_));
    LOOM_RETURN_IF_ERROR(get("A_log", {hv}, &a_log_));
    LOOM_RETURN_IF_ERROR(mat("b_proj.weight", {hv, d}, &b_proj_));
    LOOM_RETURN_IF_ERROR(mat("g_a.weight", {rank_, d}, &g_a_));
    LOOM_RETURN_IF_ERROR(mat("g_b.weight", {cv_, rank_}, &g_b_));
    if (cfg_.output_gate_bias) LOOM_RETURN_IF_ERROR(get("g_b.bias", {cv_}, &g_b_bias_));
    LOOM_RETURN_IF_ERROR(get("o_norm.weight", {dv}, &o_norm_));
    LOOM_RETURN_IF_ERROR(mat("o_proj.weight", {d, cv_}, &o_proj_));
    return absl::OkStatus();
  }

  void forward(const ForwardContext& ctx, const Tensor& x, int layer,
               const Tensor& out) const override {
    const Workspace::Mark scope(ctx.ws());
    const int64_t n = x.dim(0);
    const int64_t hk = cfg_.num_heads, hv = cfg_.num_v_heads, dk = cfg_.head_dim,
                  dv = cfg_.v_head_dim;
    const int64_t channels = 2 * ck_ + cv_;

    Tensor qkv = ctx.take({n, channels});
    Tensor fa = ctx.take({n, rank_}), f = ctx.take({n, hv * dk}), beta = ctx.take({n, hv});
    Tensor ga = ctx.take({n, rank_}), gate = ctx.take({n, cv_});
    // The decay gate's and output gate's low-rank pairs and beta read only x. At decode sizes
    // (each one GEMV kernel: kernels/side_stream.h's condition) they run on a side stream beside
    // the q|k|v projection, the layer's largest read; five small kernels that cost their launch
    // and ramp each then overlap it.
    const bool overlap = linear_is_gemv(ctx.ex, f_a_, n) && linear_is_gemv(ctx.ex, f_b_, n) &&
                         linear_is_gemv(ctx.ex, b_proj_, n) && linear_is_gemv(ctx.ex, g_a_, n) &&
                         linear_is_gemv(ctx.ex, g_b_, n);
    const Exec side = overlap ? fork_side_stream(ctx.ex) : ctx.ex;
    linear_forward(side, x, f_a_, fa);
    linear_forward(side, fa, f_b_, f);
    linear_forward(side, x, b_proj_, beta);
    linear_forward(side, x, g_a_, ga);
    linear_forward(side, ga, g_b_, gate);
    if (g_b_bias_.defined()) add_bias(side, gate, g_b_bias_);
    linear_forward(ctx.ex, x, qkv_proj_, qkv);
    if (overlap) join_side_stream(ctx.ex, side);

    Tensor o = ctx.take({n, hv, dv});
    if (linear_attention_is_decode(ctx, n)) {
      // A decode step: convolution, split, norms, gates, recurrence and the gated output norm in
      // one kernel on CUDA (three launch-bound kernels otherwise, nine before any fusion), with
      // their bits. A step that mixes prefill rows takes the path below for all of its rows.
      linear_attention_decode_step(ctx, qkv, conv_, layer, f, a_log_, dt_bias_,
                                   cfg_.gate_lower_bound, beta, o_norm_, eps_, gate,
                                   /*gate_silu=*/false, o);
    } else {
      Tensor q = ctx.take({n, hk, dk}), k = ctx.take({n, hk, dk});
      Tensor v = ctx.take({n, hv, dv});
      Tensor g = ctx.take({n, hv, dk}, DType::kF32);  // log decays: f32 (their cumsum is long)
      linear_attention_conv_qkv(ctx, qkv, conv_, layer, q, k, v);
      kda_gate_forward(ctx.ex, f, a_log_, dt_bias_, cfg_.gate_lower_bound, g.reshape({n, hv * dk}));
      sigmoid_inplace(ctx.ex, beta);
      linear_attention_delta_rule(ctx, q, k, v, g, beta, layer, o);
      // RMSNorm per head times sigmoid(gate): one kernel, the bits of the norm then the multiply.
      Tensor o_rows = o.reshape({n * hv, dv});
      rmsnorm_gated_forward(ctx.ex, o_rows, o_norm_, eps_, gate, o_rows);
    }
    linear_forward(ctx.ex, o.reshape({n, cv_}), o_proj_, out);
  }

  absl::Status backward(const ForwardContext& ctx, const Tensor& x, int layer, const Tensor& d_out,
                        const Tensor& d_x, Gradients& grads) const override {
    LOOM_RETURN_IF_ERROR(require_f32_weights(
        layer, "KDA", {&qkv_proj_, &f_a_, &f_b_, &b_proj_, &g_a_, &g_b_, &o_proj_}));
    LOOM_RETURN_IF_ERROR(training_sequences(ctx.batch).status());  // every sequence from zeros
    const Workspace::Mark scope(ctx.ws());
    const Exec& ex = ctx.ex;
    const int64_t n = x.dim(0);
    const int64_t hk = cfg_.num_heads, hv = cfg_.num_v_heads, dk = cfg_.head_dim,
                  dv = cfg_.v_head_dim;
    const int64_t channels = 2 * ck_ + cv_;
    const std::string p = absl::StrCat("layers.", layer, ".kda.");
    auto grad = [&](const char* name, const Tensor& of) -> const Tensor& {
      return grads.get(p + name, of.shape());
    };

    // Recompute the forward (every sequence from zero states), keeping what the backward reads.
    Tensor qkv = ctx.take({n, channels});
    linear_forward(ex, x, qkv_proj_, qkv);
    Tensor q_raw = ctx.take({n, hk, dk}), k_raw = ctx.take({n, hk, dk});
    Tensor q = ctx.take({n, hk, dk}), k = ctx.take({n, hk, dk}), v = ctx.take({n, hv, dv});
    linear_attention_conv_qkv_recompute(ctx, qkv, conv_, q_raw, k_raw, q, k, v);
    Tensor fa = ctx.take({n, rank_});
    linear_forward(ex, x, f_a_, fa);
    Tensor f = ctx.take({n, hv * dk});
    linear_forward(ex, fa, f_b_, f);
    Tensor g = ctx.take({n, hv, dk});
    kda_gate_forward(ex, f, a_log_, dt_bias_, cfg_.gate_lower_bound, g.reshape({n, hv * dk}));
    Tensor beta = ctx.take({n, hv});
    linear_forward(ex, x, b_proj_, beta);
    sigmoid_inplace(ex, beta);
    Tensor o = ctx.take({n, hv, dv});
    linear_attention_delta_rule_recompute(ctx, q, k, v, g, beta, o);
    Tensor ga = ctx.take({n, rank_});
    linear_forward(ex, x, g_a_, ga);
    Tensor gate = ctx.take({n, cv_});
    linear_forward(ex, ga, g_b_, gate);
    if (g_b_bias_.defined()) add_bias(ex, gate, g_b_bias_);
    const Tensor o_rows = o.reshape({n * hv, dv});
    Tensor o_normed = ctx.take({n * hv, dv});
    rmsnorm_forward(ex, o_rows, o_norm_, eps_, 0.0f, o_normed);
    Tensor y = ctx.take({n, cv_});
    copy_columns(ex, o_normed, 0, y.reshape({n * hv, dv}));
    mul_sigmoid_inplace(ex, y.reshape({n * hv, dv}), gate);

    // Backward, last op first; d_x sums the gradients of the four projections that read x.
    Tensor d_y = ctx.take({n, cv_});
    linear_backward(ex, y, o_proj_, d_out, d_y, 0.0f, grad("o_proj.weight", o_proj_));
    Tensor d_onormed = ctx.take({n * hv, dv}), d_gate = ctx.take({n, cv_});
    mul_sigmoid_backward(ex, o_normed, gate, d_y.reshape({n * hv, dv}), d_onormed, d_gate);
    Tensor d_o = ctx.take({n, hv, dv});
    rmsnorm_backward(ex, o_rows, o_norm_, eps_, 0.0f, d_onormed, d_o.reshape({n * hv, dv}),
                     grad("o_norm.weight", o_norm_));
    if (g_b_bias_.defined()) add_bias_backward(ex, d_gate, grad("g_b.bias", g_b_bias_));
    Tensor d_ga = ctx.take({n, rank_});
    linear_backward(ex, ga, g_b_, d_gate, d_ga, 0.0f, grad("g_b.weight", g_b_));
    linear_backward(ex, x, g_a_, d_ga, d_x, 0.0f, grad("g_a.weight", g_a_));

    Tensor d_q = ctx.take({n, hk, dk}), d_k = ctx.take({n, hk, dk}), d_v = ctx.take({n, hv, dv});
    Tensor d_g = ctx.take({n, hv, dk}), d_beta = ctx.take({n, hv});
    linear_attention_delta_rule_backward(ctx, q, k, v, g, beta, d_o, d_q, d_k, d_v, d_g, d_beta);
    sigmoid_backward(ex, beta, d_beta, d_beta);
    linear_backward(ex, x, b_proj_, d_beta, d_x, 1.0f, grad("b_proj.weight", b_proj_));
    Tensor d_f = ctx.take({n, hv * dk});
    kda_gate_backward(ex, f, a_log_, dt_bias_, cfg_.gate_lower_bound, d_g.reshape({n, hv * dk}),
                      d_f, grad("A_log", a_log_), grad("dt_bias", dt_bias_));
    Tensor d_fa = ctx.take({n, rank_});
    linear_backward(ex, fa, f_b_, d_f, d_fa, 0.0f, grad("f_b.weight", f_b_));
    linear_backward(ex, x, f_a_, d_fa, d_x, 1.0f, grad("f_a.weight", f_a_));

    Tensor d_qkv = ctx.take({n, channels});
    linear_attention_conv_qkv_backward(ctx, qkv, conv_, q_raw, k_raw, d_q, d_k, d_v, d_qkv,
                                       grad("conv.weight", conv_));
    linear_backward(ex, x, qkv_proj_, d_qkv, d_x, 1.0f, grad("qkv_proj.weight", qkv_proj_));
    return absl::OkStatus();
  }

 private:
  LinearAttentionConfig cfg_;
  float eps_;
  int64_t ck_ = 0, cv_ = 0, rank_ = 0;
  Tensor qkv_proj_, conv_, f_a_, f_b_, dt_bias_, a_log_, b_proj_, g_a_, g_b_, g_b_bias_, o_norm_,
      o_proj_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Mixer>> make_kda_mixer(const ModelConfig& cfg, const WeightLoader& w,
                                                      int layer) {
  auto m = std::make_unique<KdaMixer>(cfg);
  LOOM_RETURN_IF_ERROR(m->load(cfg, w, layer));
  return m;
}

}  // namespace loom
