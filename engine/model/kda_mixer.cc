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
    auto get = [&](const char* name, Shape s, Tensor* t) -> absl::Status {
      LOOM_ASSIGN_OR_RETURN(*t, w.load(p + name, s));
      return absl::OkStatus();
    };
    LOOM_RETURN_IF_ERROR(get("qkv_proj.weight", {2 * ck_ + cv_, d}, &qkv_proj_));
    LOOM_RETURN_IF_ERROR(get("conv.weight", {2 * ck_ + cv_, cfg_.conv_kernel}, &conv_));
    rank_ = cfg_.gate_rank > 0 ? cfg_.gate_rank : dk;
    LOOM_RETURN_IF_ERROR(get("f_a.weight", {rank_, d}, &f_a_));
    LOOM_RETURN_IF_ERROR(get("f_b.weight", {hv * dk, rank_}, &f_b_));
    LOOM_RETURN_IF_ERROR(get("dt_bias", {hv * dk}, &dt_bias_));
    LOOM_RETURN_IF_ERROR(get("A_log", {hv}, &a_log_));
    LOOM_RETURN_IF_ERROR(get("b_proj.weight", {hv, d}, &b_proj_));
    LOOM_RETURN_IF_ERROR(get("g_a.weight", {rank_, d}, &g_a_));
    LOOM_RETURN_IF_ERROR(get("g_b.weight", {cv_, rank_}, &g_b_));
    if (cfg_.output_gate_bias) LOOM_RETURN_IF_ERROR(get("g_b.bias", {cv_}, &g_b_bias_));
    LOOM_RETURN_IF_ERROR(get("o_norm.weight", {dv}, &o_norm_));
    LOOM_RETURN_IF_ERROR(get("o_proj.weight", {d, cv_}, &o_proj_));
    return absl::OkStatus();
  }

  void forward(const Tensor& x, const BatchLayout& batch, int layer,
               const Tensor& out) const override {
    const int64_t n = x.dim(0);
    const int64_t hk = cfg_.num_heads, hv = cfg_.num_v_heads, dk = cfg_.head_dim,
                  dv = cfg_.v_head_dim;
    const int64_t channels = 2 * ck_ + cv_;

    Tensor qkv = Tensor::empty({n, channels});
    linear_forward(x, qkv_proj_, qkv);
    Tensor q = Tensor::empty({n, hk, dk}), k = Tensor::empty({n, hk, dk});
    Tensor v = Tensor::empty({n, hv, dv});
    linear_attention_conv_qkv(qkv, conv_, batch, layer, q, k, v);

    Tensor fa = Tensor::empty({n, rank_});
    linear_forward(x, f_a_, fa);
    Tensor f = Tensor::empty({n, hv * dk});
    linear_forward(fa, f_b_, f);
    Tensor g = Tensor::empty({n, hv, dk});
    kda_gate_forward(f, a_log_, dt_bias_, cfg_.gate_lower_bound, g.reshape({n, hv * dk}));
    Tensor beta = Tensor::empty({n, hv});
    linear_forward(x, b_proj_, beta);
    sigmoid_inplace(beta);

    Tensor o = Tensor::empty({n, hv, dv});
    linear_attention_delta_rule(q, k, v, g, beta, batch, layer, o);

    Tensor ga = Tensor::empty({n, rank_});
    linear_forward(x, g_a_, ga);
    Tensor gate = Tensor::empty({n, cv_});
    linear_forward(ga, g_b_, gate);
    if (g_b_bias_.defined()) add_bias(gate, g_b_bias_);
    Tensor o_rows = o.reshape({n * hv, dv});
    rmsnorm_forward(o_rows, o_norm_, eps_, 0.0f, o_rows);
    mul_sigmoid_inplace(o_rows, gate);
    linear_forward(o.reshape({n, cv_}), o_proj_, out);
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
