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
#include "kernels/kda.h"
#include "kernels/norm.h"

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
    linear_forward(ctx.ex, x, qkv_proj_, qkv);
    Tensor q = ctx.take({n, hk, dk}), k = ctx.take({n, hk, dk});
    Tensor v = ctx.take({n, hv, dv});
    linear_attention_conv_qkv(ctx, qkv, conv_, layer, q, k, v);

    Tensor fa = ctx.take({n, rank_});
    linear_forward(ctx.ex, x, f_a_, fa);
    Tensor f = ctx.take({n, hv * dk});
    linear_forward(ctx.ex, fa, f_b_, f);
    Tensor g = ctx.take({n, hv, dk});
    kda_gate_forward(ctx.ex, f, a_log_, dt_bias_, cfg_.gate_lower_bound, g.reshape({n, hv * dk}));
    Tensor beta = ctx.take({n, hv});
    linear_forward(ctx.ex, x, b_proj_, beta);
    sigmoid_inplace(ctx.ex, beta);

    Tensor o = ctx.take({n, hv, dv});
    linear_attention_delta_rule(ctx, q, k, v, g, beta, layer, o);

    Tensor ga = ctx.take({n, rank_});
    linear_forward(ctx.ex, x, g_a_, ga);
    Tensor gate = ctx.take({n, cv_});
    linear_forward(ctx.ex, ga, g_b_, gate);
    if (g_b_bias_.defined()) add_bias(ctx.ex, gate, g_b_bias_);
    Tensor o_rows = o.reshape({n * hv, dv});
    rmsnorm_forward(ctx.ex, o_rows, o_norm_, eps_, 0.0f, o_rows);
    mul_sigmoid_inplace(ctx.ex, o_rows, gate);
    linear_forward(ctx.ex, o.reshape({n, cv_}), o_proj_, out);
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
