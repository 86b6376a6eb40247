// Multi-head latent attention mixer (MODELS.md, "MLA"). The cache keeps only the normalised latent
// and the shared rope key; attention runs in the expanded form for long chunks and the absorbed
// form for short ones (decode), picked per sequence by arithmetic cost (mla_attention_form). RoPE
// (DeepSeek: interleaved pairs, YaRN) rotates the rope parts of queries and of the shared key
// before the key is cached.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "engine/model/attention_training.h"
#include "engine/model/layers.h"
#include "engine/model/rope_table.h"
#include "engine/model/training_batch.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/gemm_backward.h"
#include "kernels/norm.h"
#include "kernels/rope.h"

namespace loom {
namespace {

// Both HF references build q_a_layernorm / kv_a_layernorm with the RMSNorm default eps, not
// config.rms_norm_eps.
constexpr float kLatentNormEps = 1e-6f;

class MlaMixer final : public Mixer {
 public:
  MlaMixer(const ModelConfig& cfg, Device device) : cfg_(cfg.mla) {
    if (cfg.rope.type != RopeConfig::Type::kNone && cfg.mla.qk_rope_head_dim > 0) {
      rope_ = make_rope_table(cfg.rope, cfg.mla.qk_rope_head_dim, device);
      use_rope_ = true;
    }
    scale_multiplier_ = yarn_softmax_scale_multiplier(cfg.rope);
  }

  absl::Status load(const ModelConfig& cfg, const WeightLoader& w, int layer) {
    const int64_t d = cfg.hidden_size, h = cfg_.num_heads;
    const int64_t qk = cfg_.qk_nope_head_dim + cfg_.qk_rope_head_dim;
    const std::string p = absl::StrCat("layers.", layer, ".mla.");
    // `get`: f32 parameters (norms; kv_b_proj, which mla_attention_varlen reads as f32);
    // `mat`: GEMM matrices, in the placement's dtype.
    auto get = [&](const char* name, Shape s, Tensor* t) -> absl::Status {
      LOOM_ASSIGN_OR_RETURN(*t, w.load(p + name, s));
      return absl::OkStatus();
    };
    auto mat = [&](const char* name, Shape s, Tensor* t) -> absl::Status {
      LOOM_ASSIGN_OR_RETURN(*t, w.load_matrix(p + name, s));
      return absl::OkStatus();
    };
    if (cfg_.q_lora_rank > 0) {
      LOOM_RETURN_IF_ERROR(mat("q_a_proj.weight", {cfg_.q_lora_rank, d}, &q_a_));
      LOOM_RETURN_IF_ERROR(get("q_a_norm.weight", {cfg_.q_lora_rank}, &q_a_norm_));
      LOOM_RETURN_IF_ERROR(mat("q_b_proj.weight", {h * qk, cfg_.q_lora_rank}, &q_b_));
    } else {
      LOOM_RETURN_IF_ERROR(mat("q_proj.weight", {h * qk, d}, &q_proj_));
    }
    LOOM_RETURN_IF_ERROR(
        mat("kv_a_proj.weight", {cfg_.kv_lora_rank + cfg_.qk_rope_head_dim, d}, &kv_a_));
    LOOM_RETURN_IF_ERROR(get("kv_a_norm.weight", {cfg_.kv_lora_rank}, &kv_a_norm_));
    LOOM_RETURN_IF_ERROR(get("kv_b_proj.weight",
                             {h * (cfg_.qk_nope_head_dim + cfg_.v_head_dim), cfg_.kv_lora_rank},
                             &kv_b_));
    LOOM_RETURN_IF_ERROR(mat("o_proj.weight", {d, h * cfg_.v_head_dim}, &o_proj_));
    if (cfg_.output_gate)
      LOOM_RETURN_IF_ERROR(mat("gate_proj.weight", {h * cfg_.v_head_dim, d}, &gate_proj_));
    scale_ = scale_multiplier_ / std::sqrt(static_cast<float>(qk));
    return absl::OkStatus();
  }

  void forward(const ForwardContext& ctx, const Tensor& x, int layer,
               const Tensor& out) const override {
    const Workspace::Mark scope(ctx.ws());
    const BatchLayout& batch = ctx.batch;
    if (ctx.training && ctx.act_dtype == DType::kF32) {
      // The expanded form through the training attention kernel, as the backward recomputes it
      // (no cache to fill: ForwardContext::training).
      const Expanded e = expand(ctx, x);
      const AttentionTail tail =
          attention_tail_recompute(ctx, layer, e.q, e.k, e.v, scale_, x, gate_proj_);
      linear_forward(ctx.ex, tail.y, o_proj_, out);
      return;
    }
    const int64_t n = x.dim(0), h = cfg_.num_heads;
    const int64_t dn = cfg_.qk_nope_head_dim, dr = cfg_.qk_rope_head_dim, dv = cfg_.v_head_dim;
    const int64_t r = cfg_.kv_lora_rank;

    Tensor q = ctx.take({n, h, dn + dr});
    if (q_proj_.defined()) {
      linear_forward(ctx.ex, x, q_proj_, q.reshape({n, h * (dn + dr)}));
    } else {
      Tensor qa = ctx.take({n, cfg_.q_lora_rank});
      linear_forward(ctx.ex, x, q_a_, qa);
      rmsnorm_forward(ctx.ex, qa, q_a_norm_, kLatentNormEps, 0.0f, qa);
      linear_forward(ctx.ex, qa, q_b_, q.reshape({n, h * (dn + dr)}));
    }
    Tensor kv = ctx.take({n, r + dr});
    linear_forward(ctx.ex, x, kv_a_, kv);
    Tensor latent = ctx.take({n, r});
    copy_columns(ctx.ex, kv, 0, latent);
    rmsnorm_forward(ctx.ex, latent, kv_a_norm_, kLatentNormEps, 0.0f, latent);
    Tensor rope = ctx.take({n, dr});
    copy_columns(ctx.ex, kv, r, rope);
    if (use_rope_) {
      rope_forward(ctx.ex, q, batch.positions, rope_, /*dim_offset=*/dn);
      rope_forward(ctx.ex, rope.reshape({n, 1, dr}), batch.positions, rope_, 0);
    }

    const MlaDims dims{h, dn, dr, dv, r};
    const Tensor& latent_pool = batch.store->pool(layer, 0);
    const Tensor& rope_pool = batch.store->pool(layer, 1);
    cache_write_varlen(ctx.ex, latent_pool, batch.page_table, batch.cu_seqlens, batch.past_lens,
                       latent);
    if (dr > 0)
      cache_write_varlen(ctx.ex, rope_pool, batch.page_table, batch.cu_seqlens, batch.past_lens,
                         rope);
    Tensor o = ctx.take({n, h, dv});
    VarlenHostLens host;
    if (batch.host_cu_seqlens.defined() && batch.host_past_lens.defined())
      host = {batch.host_cu_seqlens.data<int64_t>(), batch.host_past_lens.data<int64_t>()};
    mla_attention_varlen(ctx.ex, q, latent_pool, rope_pool, batch.page_table, batch.cu_seqlens,
                         batch.past_lens, kv_b_, dims, scale_, o, host);
    if (gate_proj_.defined()) {
      Tensor gate = ctx.take({n, h * dv});
      linear_forward(ctx.ex, x, gate_proj_, gate);
      mul_sigmoid_inplace(ctx.ex, o, gate);
    }
    linear_forward(ctx.ex, o.reshape({n, h * dv}), o_proj_, out);
  }

  // Training runs MLA in its expanded form over each whole sequence: per head the key is
  // [k_nope_h | k_rope] (the rope key shared by every head) and the value v_h, both from the
  // normalised latent through kv_b; causal_attention_* then treat it as attention with as many
  // key heads as query heads.
  absl::Status backward(const ForwardContext& ctx, const Tensor& x, int layer, const Tensor& d_out,
                        const Tensor& d_x, Gradients& grads) const override {
    LOOM_RETURN_IF_ERROR(
        require_f32_weights(layer, "MLA", {&q_proj_, &q_a_, &q_b_, &kv_a_, &o_proj_, &gate_proj_}));
    LOOM_RETURN_IF_ERROR(training_sequences(ctx.batch).status());  // every sequence from zeros
    const Workspace::Mark scope(ctx.ws());
    const Exec& ex = ctx.ex;
    const int64_t n = x.dim(0), h = cfg_.num_heads;
    const int64_t dn = cfg_.qk_nope_head_dim, dr = cfg_.qk_rope_head_dim, dv = cfg_.v_head_dim;
    const int64_t r = cfg_.kv_lora_rank, qk = dn + dr, ql = cfg_.q_lora_rank;
    const std::string p = absl::StrCat("layers.", layer, ".mla.");
    auto grad = [&](const char* name, const Tensor& of) -> const Tensor& {
      return grads.get(p + name, of.shape());
    };

    // Recompute the forward, keeping what the backward reads.
    const Expanded e = expand(ctx, x);
    const Tensor &q = e.q, &k = e.k, &v = e.v, &qa_pre = e.qa_pre, &qa = e.qa;
    const Tensor &latent_pre = e.latent_pre, &latent = e.latent, &nope_rows = e.nope_rows;
    const AttentionTail tail = attention_tail_recompute(ctx, layer, q, k, v, scale_, x, gate_proj_);

    // Backward.
    Tensor d_q = ctx.take({n, h, qk}), d_k = ctx.take(k.shape()), d_v = ctx.take(v.shape());
    const float beta_x = attention_tail_backward(ctx, q, k, v, scale_, x, gate_proj_, o_proj_, tail,
                                                 d_out, d_x, p, grads, d_q, d_k, d_v);
    // Split the key and value gradients back: k_nope_h and v_h into the expanded layout, the
    // shared rope key summing every head's share in head order.
    Tensor d_expanded = ctx.take({n, h, dn + dv}), d_rope = ctx.take({n, 1, dr});
    const Tensor d_k_rows = d_k.reshape({n * h, qk});
    const Tensor d_expanded_rows = d_expanded.reshape({n * h, dn + dv});
    copy_columns(ex, d_k_rows, 0, nope_rows);
    scatter_columns(ex, nope_rows, 0, d_expanded_rows);
    scatter_columns(ex, d_v.reshape({n * h, dv}), dn, d_expanded_rows);
    // d_rope = 0 + head 0's share + head 1's + ...: the sum in head order.
    const Tensor d_k_cols = d_k.reshape({n, h * qk}), d_rope_cols = d_rope.reshape({n, dr});
    Tensor share = ctx.take({n, dr});
    zero_fill(ex, d_rope);
    for (int64_t hh = 0; dr > 0 && hh < h; ++hh) {
      copy_columns(ex, d_k_cols, hh * qk + dn, share);
      add_inplace(ex, d_rope_cols, share);
    }
    Tensor d_latent = ctx.take({n, r});
    linear_backward(ex, latent, kv_b_, d_expanded.reshape({n, h * (dn + dv)}), d_latent, 0.0f,
                    grad("kv_b_proj.weight", kv_b_));
    if (use_rope_) {
      rope_backward(ex, d_rope, ctx.batch.positions, rope_, 0);
      rope_backward(ex, d_q, ctx.batch.positions, rope_, /*dim_offset=*/dn);
    }
    Tensor d_kv = ctx.take({n, r + dr});
    rmsnorm_backward(ex, latent_pre, kv_a_norm_, kLatentNormEps, 0.0f, d_latent, d_latent,
                     grad("kv_a_norm.weight", kv_a_norm_));
    scatter_columns(ex, d_latent, 0, d_kv);
    scatter_columns(ex, d_rope.reshape({n, dr}), r, d_kv);
    linear_backward(ex, x, kv_a_, d_kv, d_x, beta_x, grad("kv_a_proj.weight", kv_a_));
    if (q_proj_.defined()) {
      linear_backward(ex, x, q_proj_, d_q.reshape({n, h * qk}), d_x, 1.0f,
                      grad("q_proj.weight", q_proj_));
    } else {
      Tensor d_qa = ctx.take({n, ql});
      linear_backward(ex, qa, q_b_, d_q.reshape({n, h * qk}), d_qa, 0.0f,
                      grad("q_b_proj.weight", q_b_));
      rmsnorm_backward(ex, qa_pre, q_a_norm_, kLatentNormEps, 0.0f, d_qa, d_qa,
                       grad("q_a_norm.weight", q_a_norm_));
      linear_backward(ex, x, q_a_, d_qa, d_x, 1.0f, grad("q_a_proj.weight", q_a_));
    }
    return absl::OkStatus();
  }

  // The expanded form's q, k, v of every row (RoPE applied) and what the backward reads of their
  // making, in step memory of the caller's scope. Per head the key is [k_nope_h | k_rope] (the rope
  // key shared by every head) and the value v_h, both from the normalised latent through kv_b.
  struct Expanded {
    Tensor q, k, v;             // [N, H, qk], [N, H, qk], [N, H, dv]
    Tensor qa_pre, qa;          // q_a's output before and after its norm (q_lora_rank > 0 only)
    Tensor latent_pre, latent;  // the latent before and after kv_a_norm
    Tensor nope_rows;           // [N H, dn] scratch of the column moves
  };
  Expanded expand(const ForwardContext& ctx, const Tensor& x) const {
    const Exec& ex = ctx.ex;
    const int64_t n = x.dim(0), h = cfg_.num_heads;
    const int64_t dn = cfg_.qk_nope_head_dim, dr = cfg_.qk_rope_head_dim, dv = cfg_.v_head_dim;
    const int64_t r = cfg_.kv_lora_rank, qk = dn + dr, ql = cfg_.q_lora_rank;
    Expanded e;
    e.q = ctx.take({n, h, qk});
    if (q_proj_.defined()) {
      linear_forward(ex, x, q_proj_, e.q.reshape({n, h * qk}));
    } else {
      e.qa_pre = ctx.take({n, ql});
      e.qa = ctx.take({n, ql});
      linear_forward(ex, x, q_a_, e.qa_pre);
      rmsnorm_forward(ex, e.qa_pre, q_a_norm_, kLatentNormEps, 0.0f, e.qa);
      linear_forward(ex, e.qa, q_b_, e.q.reshape({n, h * qk}));
    }
    Tensor kv = ctx.take({n, r + dr});
    linear_forward(ex, x, kv_a_, kv);
    e.latent_pre = ctx.take({n, r});
    e.latent = ctx.take({n, r});
    copy_columns(ex, kv, 0, e.latent_pre);
    rmsnorm_forward(ex, e.latent_pre, kv_a_norm_, kLatentNormEps, 0.0f, e.latent);
    Tensor k_rope = ctx.take({n, dr});
    copy_columns(ex, kv, r, k_rope);
    if (use_rope_) {
      rope_forward(ex, e.q, ctx.batch.positions, rope_, /*dim_offset=*/dn);
      rope_forward(ex, k_rope.reshape({n, 1, dr}), ctx.batch.positions, rope_, 0);
    }
    Tensor expanded = ctx.take({n, h, dn + dv});  // [k_nope_h | v_h] per head
    linear_forward(ex, e.latent, kv_b_, expanded.reshape({n, h * (dn + dv)}));
    // k = [k_nope_h | k_rope] and v_h per head, by column copies on the model's device; the shared
    // rope key is written into every head's columns (one column copy a head: no index tensor to
    // upload, so no synchronisation with the device).
    e.k = ctx.take({n, h, qk});
    e.v = ctx.take({n, h, dv});
    const Tensor expanded_rows = expanded.reshape({n * h, dn + dv});
    const Tensor k_rows = e.k.reshape({n * h, qk});
    e.nope_rows = ctx.take({n * h, dn});
    copy_columns(ex, expanded_rows, 0, e.nope_rows);
    scatter_columns(ex, e.nope_rows, 0, k_rows);
    const Tensor k_cols = e.k.reshape({n, h * qk});
    for (int64_t hh = 0; dr > 0 && hh < h; ++hh) scatter_columns(ex, k_rope, hh * qk + dn, k_cols);
    copy_columns(ex, expanded_rows, dn, e.v.reshape({n * h, dv}));
    return e;
  }

  // The YaRN softmax multiplier depends on the factor and mscale, not on theta: it stays.
  bool rebuild_rope(const RopeConfig& rope, Device device) override {
    if (!use_rope_) return false;
    rope_ = make_rope_table(rope, cfg_.qk_rope_head_dim, device);
    return true;
  }

 private:
  MlaConfig cfg_;
  bool use_rope_ = false;
  RopeTable rope_;
  float scale_multiplier_ = 1.0f;
  float scale_ = 1.0f;
  Tensor q_proj_, q_a_, q_a_norm_, q_b_, kv_a_, kv_a_norm_, kv_b_, o_proj_, gate_proj_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Mixer>> make_mla_mixer(const ModelConfig& cfg, const WeightLoader& w,
                                                      int layer) {
  auto m = std::make_unique<MlaMixer>(cfg, w.placement().device);
  LOOM_RETURN_IF_ERROR(m->load(cfg, w, layer));
  return m;
}

}  // namespace loom
