// Gated DeltaNet mixer (MODELS.md, "Gated DeltaNet"; qwen3_next). Canonical layout (the adapter
// regroups qwen3_next's per-key-head interleaving): qkvz_proj rows are [q (Hk*dk) | k (Hk*dk) |
// v (Hv*dv) | z (Hv*dv)], ba_proj rows [b (Hv) | a (Hv)]. One short convolution over q|k|v, scalar
// decay per value head, value head h reads key head h / (Hv / Hk), SiLU-gated RMSNorm output.

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "engine/model/layers.h"
#include "engine/model/linear_attention.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/gemm_backward.h"
#include "kernels/kda.h"
#include "kernels/kda_backward.h"
#include "kernels/norm.h"

namespace loom {
namespace {

class GdnMixer final : public Mixer {
 public:
  explicit GdnMixer(const ModelConfig& cfg) : cfg_(cfg.linear), eps_(cfg.rms_norm_eps) {}

  absl::Status load(const ModelConfig& cfg, const WeightLoader& w, int layer) {
    const int64_t d = cfg.hidden_size, hv = cfg_.num_v_heads;
    ck_ = static_cast<int64_t>(cfg_.num_heads) * cfg_.head_dim;
    cv_ = hv * cfg_.v_head_dim;
    const std::string p = absl::StrCat("layers.", layer, ".gdn.");
    LOOM_ASSIGN_OR_RETURN(qkvz_proj_,
                          w.load_matrix(p + "qkvz_proj.weight", {2 * ck_ + 2 * cv_, d}));
    LOOM_ASSIGN_OR_RETURN(ba_proj_, w.load_matrix(p + "ba_proj.weight", {2 * hv, d}));
    LOOM_ASSIGN_OR_RETURN(conv_, w.load(p + "conv.weight", {2 * ck_ + cv_, cfg_.conv_kernel}));
    LOOM_ASSIGN_OR_RETURN(a_log_, w.load(p + "A_log", {hv}));
    LOOM_ASSIGN_OR_RETURN(dt_bias_, w.load(p + "dt_bias", {hv}));
    LOOM_ASSIGN_OR_RETURN(norm_, w.load(p + "norm.weight", {cfg_.v_head_dim}));
    LOOM_ASSIGN_OR_RETURN(o_proj_, w.load_matrix(p + "o_proj.weight", {d, cv_}));
    return absl::OkStatus();
  }

  void forward(const ForwardContext& ctx, const Tensor& x, int layer,
               const Tensor& out) const override {
    const Workspace::Mark scope(ctx.ws());
    const int64_t n = x.dim(0);
    const int64_t hk = cfg_.num_heads, hv = cfg_.num_v_heads, dk = cfg_.head_dim,
                  dv = cfg_.v_head_dim;
    const int64_t channels = 2 * ck_ + cv_;
    Tensor qkvz = ctx.take({n, channels + cv_});
    linear_forward(ctx.ex, x, qkvz_proj_, qkvz);
    Tensor qkv = ctx.take({n, channels}), z = ctx.take({n, cv_});
    copy_columns(ctx.ex, qkvz, 0, qkv);
    copy_columns(ctx.ex, qkvz, channels, z);
    Tensor ba = ctx.take({n, 2 * hv});
    linear_forward(ctx.ex, x, ba_proj_, ba);
    Tensor beta = ctx.take({n, hv}), a = ctx.take({n, hv});
    copy_columns(ctx.ex, ba, 0, beta);
    copy_columns(ctx.ex, ba, hv, a);

    Tensor o = ctx.take({n, hv, dv});
    if (linear_attention_is_decode(ctx, n)) {
      // A decode step: KDA's fused step (one decay per head, the output gated by silu(z)), one
      // kernel on CUDA with the bits of the separate ops.
      linear_attention_decode_step(ctx, qkv, conv_, layer, a, a_log_, dt_bias_,
                                   /*lower_bound=*/0.0f, beta, norm_, eps_, z, /*gate_silu=*/true,
                                   o);
    } else {
      Tensor q = ctx.take({n, hk, dk}), k = ctx.take({n, hk, dk});
      Tensor v = ctx.take({n, hv, dv});
      Tensor g = ctx.take({n, hv, 1}, DType::kF32);  // log decays: f32 (their cumsum is long)
      linear_attention_conv_qkv(ctx, qkv, conv_, layer, q, k, v);
      sigmoid_inplace(ctx.ex, beta);
      kda_gate_forward(ctx.ex, a, a_log_, dt_bias_, /*lower_bound=*/0.0f, g.reshape({n, hv}));
      linear_attention_delta_rule(ctx, q, k, v, g, beta, layer, o);
      Tensor o_rows = o.reshape({n * hv, dv});
      rmsnorm_forward(ctx.ex, o_rows, norm_, eps_, 0.0f, o_rows);
      mul_silu_inplace(ctx.ex, o_rows, z);
    }
    linear_forward(ctx.ex, o.reshape({n, cv_}), o_proj_, out);
  }

  absl::Status backward(const ForwardContext& ctx, const Tensor& x, int layer, const Tensor& d_out,
                        const Tensor& d_x, Gradients& grads) const override {
    LOOM_RETURN_IF_ERROR(
        require_f32_weights(layer, "Gated DeltaNet", {&qkvz_proj_, &ba_proj_, &o_proj_}));
    LOOM_RETURN_IF_ERROR(training_sequences(ctx.batch).status());  // every sequence from zeros
    const Workspace::Mark scope(ctx.ws());
    const Exec& ex = ctx.ex;
    const int64_t n = x.dim(0);
    const int64_t hk = cfg_.num_heads, hv = cfg_.num_v_heads, dk = cfg_.head_dim,
                  dv = cfg_.v_head_dim;
    const int64_t channels = 2 * ck_ + cv_;
    const std::string p = absl::StrCat("layers.", layer, ".gdn.");
    auto grad = [&](const char* name, const Tensor& of) -> const Tensor& {
      return grads.get(p + name, of.shape());
    };

    // Recompute the forward (every sequence from zero states), keeping what the backward reads.
    Tensor qkvz = ctx.take({n, channels + cv_});
    linear_forward(ex, x, qkvz_proj_, qkvz);
    Tensor qkv = ctx.take({n, channels}), z = ctx.take({n, cv_});
    copy_columns(ex, qkvz, 0, qkv);
    copy_columns(ex, qkvz, channels, z);
    Tensor q_raw = ctx.take({n, hk, dk}), k_raw = ctx.take({n, hk, dk});
    Tensor q = ctx.take({n, hk, dk}), k = ctx.take({n, hk, dk}), v = ctx.take({n, hv, dv});
    linear_attention_conv_qkv_recompute(ctx, qkv, conv_, q_raw, k_raw, q, k, v);
    Tensor ba = ctx.take({n, 2 * hv});
    linear_forward(ex, x, ba_proj_, ba);
    Tensor beta = ctx.take({n, hv}), a = ctx.take({n, hv});
    copy_columns(ex, ba, 0, beta);
    copy_columns(ex, ba, hv, a);
    sigmoid_inplace(ex, beta);
    Tensor g = ctx.take({n, hv, 1});
    kda_gate_forward(ex, a, a_log_, dt_bias_, /*lower_bound=*/0.0f, g.reshape({n, hv}));
    Tensor o = ctx.take({n, hv, dv});
    linear_attention_delta_rule_recompute(ctx, q, k, v, g, beta, o);
    const Tensor o_rows = o.reshape({n * hv, dv});
    Tensor o_normed = ctx.take({n * hv, dv});
    rmsnorm_forward(ex, o_rows, norm_, eps_, 0.0f, o_normed);
    Tensor y = ctx.take({n, cv_});
    copy_columns(ex, o_normed, 0, y.reshape({n * hv, dv}));
    mul_silu_inplace(ex, y.reshape({n * hv, dv}), z);

    // Backward, last op first.
    Tensor d_y = ctx.take({n, cv_});
    linear_backward(ex, y, o_proj_, d_out, d_y, 0.0f, grad("o_proj.weight", o_proj_));
    Tensor d_onormed = ctx.take({n * hv, dv});
    Tensor d_qkvz = ctx.take({n, channels + cv_}), d_z = ctx.take({n, cv_});
    mul_silu_backward(ex, o_normed, z, d_y.reshape({n * hv, dv}), d_onormed, d_z);
    Tensor d_o = ctx.take({n, hv, dv});
    rmsnorm_backward(ex, o_rows, norm_, eps_, 0.0f, d_onormed, d_o.reshape({n * hv, dv}),
                     grad("norm.weight", norm_));
    Tensor d_q = ctx.take({n, hk, dk}), d_k = ctx.take({n, hk, dk}), d_v = ctx.take({n, hv, dv});
    Tensor d_g = ctx.take({n, hv, 1}), d_beta = ctx.take({n, hv});
    linear_attention_delta_rule_backward(ctx, q, k, v, g, beta, d_o, d_q, d_k, d_v, d_g, d_beta);
    sigmoid_backward(ex, beta, d_beta, d_beta);
    Tensor d_a = ctx.take({n, hv});
    kda_gate_backward(ex, a, a_log_, dt_bias_, /*lower_bound=*/0.0f, d_g.reshape({n, hv}), d_a,
                      grad("A_log", a_log_), grad("dt_bias", dt_bias_));
    Tensor d_ba = ctx.take({n, 2 * hv});
    scatter_columns(ex, d_beta, 0, d_ba);
    scatter_columns(ex, d_a, hv, d_ba);
    linear_backward(ex, x, ba_proj_, d_ba, d_x, 0.0f, grad("ba_proj.weight", ba_proj_));
    Tensor d_qkv = ctx.take({n, channels});
    linear_attention_conv_qkv_backward(ctx, qkv, conv_, q_raw, k_raw, d_q, d_k, d_v, d_qkv,
                                       grad("conv.weight", conv_));
    scatter_columns(ex, d_qkv, 0, d_qkvz);
    scatter_columns(ex, d_z, channels, d_qkvz);
    linear_backward(ex, x, qkvz_proj_, d_qkvz, d_x, 1.0f, grad("qkvz_proj.weight", qkvz_proj_));
    return absl::OkStatus();
  }

 private:
  LinearAttentionConfig cfg_;
  float eps_;
  int64_t ck_ = 0, cv_ = 0;
  Tensor qkvz_proj_, ba_proj_, conv_, a_log_, dt_bias_, norm_, o_proj_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Mixer>> make_gdn_mixer(const ModelConfig& cfg, const WeightLoader& w,
                                                      int layer) {
  auto m = std::make_unique<GdnMixer>(cfg);
  LOOM_RETURN_IF_ERROR(m->load(cfg, w, layer));
  return m;
}

}  // namespace loom
