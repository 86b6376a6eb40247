// Grouped-query attention mixer (MODELS.md, "Full attention"): qwen3_next's gated attention
// (per-head zero-centred q/k RMSNorm, partial rotate_half RoPE, sigmoid output gate) and the fla
// kda family's plain GQA with full-dim RoPE. The cache keeps rotated keys and values per position.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "engine/model/attention_training.h"
#include "engine/model/layers.h"
#include "engine/model/rope_table.h"
#include "engine/model/training_batch.h"
#include "kernels/attention.h"
#include "kernels/attention_backward.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/gemm_backward.h"
#include "kernels/norm.h"
#include "kernels/rope.h"

namespace loom {
namespace {

class GqaMixer final : public Mixer {
 public:
  GqaMixer(const ModelConfig& cfg, Device device)
      : cfg_(cfg.gqa), eps_(cfg.rms_norm_eps), norm_offset_(cfg.norm_weight_offset) {
    if (cfg.rope.type != RopeConfig::Type::kNone) {
      rope_ = make_rope_table(cfg.rope, cfg.gqa.head_dim, device);
      use_rope_ = true;
    }
  }

  absl::Status load(const ModelConfig& cfg, const WeightLoader& w, int layer) {
    const int64_t d = cfg.hidden_size, h = cfg_.num_heads, kvh = cfg_.num_kv_heads,
                  hd = cfg_.head_dim;
    const std::string p = absl::StrCat("layers.", layer, ".gqa.");
    LOOM_ASSIGN_OR_RETURN(q_proj_, w.load_matrix(p + "q_proj.weight", {h * hd, d}));
    LOOM_ASSIGN_OR_RETURN(k_proj_, w.load_matrix(p + "k_proj.weight", {kvh * hd, d}));
    LOOM_ASSIGN_OR_RETURN(v_proj_, w.load_matrix(p + "v_proj.weight", {kvh * hd, d}));
    LOOM_ASSIGN_OR_RETURN(o_proj_, w.load_matrix(p + "o_proj.weight", {d, h * hd}));
    if (cfg_.output_gate) {
      LOOM_ASSIGN_OR_RETURN(gate_proj_, w.load_matrix(p + "gate_proj.weight", {h * hd, d}));
    }
    if (cfg_.qk_norm) {
      LOOM_ASSIGN_OR_RETURN(q_norm_, w.load(p + "q_norm.weight", {hd}));
      LOOM_ASSIGN_OR_RETURN(k_norm_, w.load(p + "k_norm.weight", {hd}));
    }
    return absl::OkStatus();
  }

  void forward(const ForwardContext& ctx, const Tensor& x, int layer,
               const Tensor& out) const override {
    const Workspace::Mark scope(ctx.ws());
    const BatchLayout& batch = ctx.batch;
    const int64_t n = x.dim(0), h = cfg_.num_heads, kvh = cfg_.num_kv_heads, hd = cfg_.head_dim;
    Tensor q = ctx.take({n, h, hd}), k = ctx.take({n, kvh, hd}), v = ctx.take({n, kvh, hd});
    linear_forward(ctx.ex, x, q_proj_, q.reshape({n, h * hd}));
    linear_forward(ctx.ex, x, k_proj_, k.reshape({n, kvh * hd}));
    linear_forward(ctx.ex, x, v_proj_, v.reshape({n, kvh * hd}));
    if (q_norm_.defined()) {
      rmsnorm_forward(ctx.ex, q.reshape({n * h, hd}), q_norm_, eps_, norm_offset_,
                      q.reshape({n * h, hd}));
      rmsnorm_forward(ctx.ex, k.reshape({n * kvh, hd}), k_norm_, eps_, norm_offset_,
                      k.reshape({n * kvh, hd}));
    }
    if (use_rope_) {
      rope_forward(ctx.ex, q, batch.positions, rope_, 0);
      rope_forward(ctx.ex, k, batch.positions, rope_, 0);
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    if (ctx.training && ctx.act_dtype == DType::kF32) {
      // The backward's own attention kernel over the step's keys and values (no cache to fill),
      // its outputs kept on the tape for the backward.
      const AttentionTail tail =
          attention_tail_recompute(ctx, layer, q, k, v, scale, x, gate_proj_);
      linear_forward(ctx.ex, tail.y, o_proj_, out);
      return;
    }
    Tensor o = ctx.take({n, h, hd});
    const Tensor& k_pool = batch.store->pool(layer, 0);
    const Tensor& v_pool = batch.store->pool(layer, 1);
    cache_write_varlen(ctx.ex, k_pool, batch.page_table, batch.cu_seqlens, batch.past_lens, k);
    cache_write_varlen(ctx.ex, v_pool, batch.page_table, batch.cu_seqlens, batch.past_lens, v);
    gqa_attention_varlen(ctx.ex, q, k_pool, v_pool, batch.page_table, batch.cu_seqlens,
                         batch.past_lens, scale, o);
    if (gate_proj_.defined()) {
      Tensor gate = ctx.take({n, h * hd});
      linear_forward(ctx.ex, x, gate_proj_, gate);
      mul_sigmoid_inplace(ctx.ex, o, gate);
    }
    linear_forward(ctx.ex, o.reshape({n, h * hd}), o_proj_, out);
  }

  absl::Status backward(const ForwardContext& ctx, const Tensor& x, int layer, const Tensor& d_out,
                        const Tensor& d_x, Gradients& grads) const override {
    LOOM_RETURN_IF_ERROR(
        require_f32_weights(layer, "attention", {&q_proj_, &k_proj_, &v_proj_, &o_proj_}));
    LOOM_RETURN_IF_ERROR(training_sequences(ctx.batch).status());  // every sequence from zeros
    const Workspace::Mark scope(ctx.ws());
    const Exec& ex = ctx.ex;
    const int64_t n = x.dim(0), h = cfg_.num_heads, kvh = cfg_.num_kv_heads, hd = cfg_.head_dim;
    const std::string p = absl::StrCat("layers.", layer, ".gqa.");
    auto grad = [&](const char* name, const Tensor& of) -> const Tensor& {
      return grads.get(p + name, of.shape());
    };
    // Recompute: projections, q/k norms (their inputs kept), RoPE, attention per sequence with
    // each query's log-sum-exp, the gate.
    Tensor q_lin = ctx.take({n, h, hd}), k_lin = ctx.take({n, kvh, hd});
    Tensor q = ctx.take({n, h, hd}), k = ctx.take({n, kvh, hd}), v = ctx.take({n, kvh, hd});
    linear_forward(ex, x, q_proj_, q_lin.reshape({n, h * hd}));
    linear_forward(ex, x, k_proj_, k_lin.reshape({n, kvh * hd}));
    linear_forward(ex, x, v_proj_, v.reshape({n, kvh * hd}));
    if (q_norm_.defined()) {
      rmsnorm_forward(ex, q_lin.reshape({n * h, hd}), q_norm_, eps_, norm_offset_,
                      q.reshape({n * h, hd}));
      rmsnorm_forward(ex, k_lin.reshape({n * kvh, hd}), k_norm_, eps_, norm_offset_,
                      k.reshape({n * kvh, hd}));
    } else {
      copy_columns(ex, q_lin.reshape({n, h * hd}), 0, q.reshape({n, h * hd}));
      copy_columns(ex, k_lin.reshape({n, kvh * hd}), 0, k.reshape({n, kvh * hd}));
    }
    if (use_rope_) {
      rope_forward(ex, q, ctx.batch.positions, rope_, 0);
      rope_forward(ex, k, ctx.batch.positions, rope_, 0);
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const AttentionTail tail = attention_tail_recompute(ctx, layer, q, k, v, scale, x, gate_proj_);

    // Backward.
    Tensor d_q = ctx.take({n, h, hd}), d_k = ctx.take(k.shape()), d_v = ctx.take(v.shape());
    const float beta_x = attention_tail_backward(ctx, q, k, v, scale, x, gate_proj_, o_proj_, tail,
                                                 d_out, d_x, p, grads, d_q, d_k, d_v);
    if (use_rope_) {
      rope_backward(ex, d_q, ctx.batch.positions, rope_, 0);
      rope_backward(ex, d_k, ctx.batch.positions, rope_, 0);
    }
    if (q_norm_.defined()) {
      rmsnorm_backward(ex, q_lin.reshape({n * h, hd}), q_norm_, eps_, norm_offset_,
                       d_q.reshape({n * h, hd}), d_q.reshape({n * h, hd}),
                       grad("q_norm.weight", q_norm_));
      rmsnorm_backward(ex, k_lin.reshape({n * kvh, hd}), k_norm_, eps_, norm_offset_,
                       d_k.reshape({n * kvh, hd}), d_k.reshape({n * kvh, hd}),
                       grad("k_norm.weight", k_norm_));
    }
    linear_backward(ex, x, q_proj_, d_q.reshape({n, h * hd}), d_x, beta_x,
                    grad("q_proj.weight", q_proj_));
    linear_backward(ex, x, k_proj_, d_k.reshape({n, kvh * hd}), d_x, 1.0f,
                    grad("k_proj.weight", k_proj_));
    linear_backward(ex, x, v_proj_, d_v.reshape({n, kvh * hd}), d_x, 1.0f,
                    grad("v_proj.weight", v_proj_));
    return absl::OkStatus();
  }

  bool rebuild_rope(const RopeConfig& rope, Device device) override {
    if (!use_rope_) return false;
    rope_ = make_rope_table(rope, cfg_.head_dim, device);
    return true;
  }

 private:
  GqaConfig cfg_;
  float eps_, norm_offset_;
  bool use_rope_ = false;
  RopeTable rope_;
  Tensor q_proj_, k_proj_, v_proj_, o_proj_, gate_proj_, q_norm_, k_norm_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Mixer>> make_gqa_mixer(const ModelConfig& cfg, const WeightLoader& w,
                                                      int layer) {
  auto m = std::make_unique<GqaMixer>(cfg, w.placement().device);
  LOOM_RETURN_IF_ERROR(m->load(cfg, w, layer));
  return m;
}

}  // namespace loom
