// FFN blocks: the dense SwiGLU MLP and the mixture of experts with shared experts.
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "engine/model/layers.h"
#include "engine/parallel/local_expert_dispatcher.h"
#include "kernels/activation.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/gemm_backward.h"
#include "kernels/moe.h"

namespace loom {
namespace {

class DenseFfn final : public Ffn {
 public:
  absl::Status load(const ModelConfig& cfg, const WeightLoader& w, const std::string& prefix,
                    int width) {
    const int64_t d = cfg.hidden_size;
    LOOM_ASSIGN_OR_RETURN(gate_, w.load_matrix(prefix + "gate_proj.weight", {width, d}));
    LOOM_ASSIGN_OR_RETURN(up_, w.load_matrix(prefix + "up_proj.weight", {width, d}));
    LOOM_ASSIGN_OR_RETURN(down_, w.load_matrix(prefix + "down_proj.weight", {d, width}));
    width_ = width;
    prefix_ = prefix;
    return absl::OkStatus();
  }

  void forward(const ForwardContext& ctx, const Tensor& x, const Tensor& out) const override {
    const Workspace::Mark scope(ctx.ws());
    const int64_t n = x.dim(0);
    Tensor g = ctx.take({n, width_}), u = ctx.take({n, width_});
    linear_forward(ctx.ex, x, gate_, g);
    linear_forward(ctx.ex, x, up_, u);
    silu_mul_forward(ctx.ex, g, u, g);
    linear_forward(ctx.ex, g, down_, out);
  }

  absl::Status backward(const ForwardContext& ctx, const Tensor& x, const Tensor& d_out,
                        const Tensor& d_x, Gradients& grads) const override {
    if (gate_.dtype() != DType::kF32)
      return absl::UnimplementedError("training: the dense FFN's weights must be f32");
    const Workspace::Mark scope(ctx.ws());
    const int64_t n = x.dim(0);
    // Recompute the gate and up projections and their product.
    Tensor g = ctx.take({n, width_}), u = ctx.take({n, width_}), h = ctx.take({n, width_});
    linear_forward(ctx.ex, x, gate_, g);
    linear_forward(ctx.ex, x, up_, u);
    silu_mul_forward(ctx.ex, g, u, h);
    Tensor d_h = ctx.take({n, width_});
    linear_backward(ctx.ex, h, down_, d_out, d_h, 0.0f,
                    grads.get(prefix_ + "down_proj.weight", down_.shape()));
    // d_gate and d_up overwrite g and u (each element is read before it is written).
    silu_mul_backward(ctx.ex, g, u, d_h, g, u);
    linear_backward(ctx.ex, x, gate_, g, d_x, 0.0f,
                    grads.get(prefix_ + "gate_proj.weight", gate_.shape()));
    linear_backward(ctx.ex, x, up_, u, d_x, 1.0f,
                    grads.get(prefix_ + "up_proj.weight", up_.shape()));
    return absl::OkStatus();
  }

 private:
  std::string prefix_;  // canonical name prefix of the weights ("layers.3.mlp.")
  int64_t width_ = 0;
  Tensor gate_, up_, down_;
};

class MoeFfn final : public Ffn {
 public:
  absl::Status load(const ModelConfig& cfg, const WeightLoader& w, int layer) {
    const MoeConfig& m = cfg.moe;
    const int64_t d = cfg.hidden_size, e = m.num_experts, i = m.intermediate_size;
    const std::string p = absl::StrCat("layers.", layer, ".moe.");
    LOOM_ASSIGN_OR_RETURN(router_, w.load(p + "router.weight", {e, d}));
    if (m.has_score_bias) {
      LOOM_ASSIGN_OR_RETURN(bias_, w.load(p + "router.bias", {e}));
    }
    // Only the placement's experts are loaded ([owned, I, D]); the router covers all of them and
    // the dispatcher sends the grouped GEMMs only the slots routed to the owned ones.
    LOOM_ASSIGN_OR_RETURN(w_gate_, w.load_experts(p + "experts.gate", {e, i, d}));
    LOOM_ASSIGN_OR_RETURN(w_up_, w.load_experts(p + "experts.up", {e, i, d}));
    LOOM_ASSIGN_OR_RETURN(w_down_, w.load_experts(p + "experts.down", {e, d, i}));
    dispatcher_ = std::make_unique<LocalExpertDispatcher>(e, w.placement().owned_experts(e));
    LOOM_CHECK(dispatcher_->owned().count() == w_gate_.dim(0),
               "MoE layer %d: the dispatcher owns %d experts, the weights hold %d", layer,
               dispatcher_->owned().count(), w_gate_.dim(0));
    if (m.num_shared_experts > 0) {
      auto shared = std::make_unique<DenseFfn>();
      LOOM_RETURN_IF_ERROR(shared->load(cfg, w, p + "shared.", m.shared_intermediate_size));
      shared_ = std::move(shared);
    }
    if (m.shared_expert_gate) {
      LOOM_ASSIGN_OR_RETURN(shared_gate_, w.load(p + "shared_gate.weight", {1, d}));
    }
    params_.score = m.score_sigmoid ? RouterScore::kSigmoid : RouterScore::kSoftmax;
    params_.top_k = m.top_k;
    params_.n_group = m.n_group;
    params_.topk_group = m.topk_group;
    params_.renormalize = m.renormalize;
    params_.routed_scaling = m.routed_scaling;
    return absl::OkStatus();
  }

  void forward(const ForwardContext& ctx, const Tensor& x, const Tensor& out) const override {
    const Workspace::Mark scope(ctx.ws());
    const int64_t n = x.dim(0), e = router_.dim(0);
    Tensor logits = ctx.take({n, e});
    linear_forward(ctx.ex, x, router_, logits);
    Tensor ids = ctx.take({n, params_.top_k}, DType::kI32);
    Tensor weights = ctx.take({n, params_.top_k});
    moe_route(ctx.ex, logits, bias_, params_, ids, weights);
    const Dispatched routed = dispatcher_->dispatch(ctx.ex, x, ids, weights, ctx.ws());
    Tensor y = ctx.take(routed.rows.shape());
    moe_grouped_swiglu(ctx.ex, routed.rows, routed.offsets, w_gate_, w_up_, w_down_, y);
    dispatcher_->combine(ctx.ex, y, routed, out);
    if (shared_) {
      Tensor s = ctx.take(out.shape());
      shared_->forward(ctx, x, s);
      if (shared_gate_.defined()) {
        Tensor g = ctx.take({n, 1});
        linear_forward(ctx.ex, x, shared_gate_, g);
        mul_sigmoid_rows(ctx.ex, s, g);
      }
      add_inplace(ctx.ex, out, s);
    }
  }

 private:
  RouterParams params_;
  Tensor router_, bias_, w_gate_, w_up_, w_down_, shared_gate_;
  std::unique_ptr<DenseFfn> shared_;
  std::unique_ptr<ExpertDispatcher> dispatcher_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Ffn>> make_dense_ffn(const ModelConfig& cfg, const WeightLoader& w,
                                                    const std::string& prefix, int width) {
  auto f = std::make_unique<DenseFfn>();
  LOOM_RETURN_IF_ERROR(f->load(cfg, w, prefix, width));
  return f;
}

absl::StatusOr<std::unique_ptr<Ffn>> make_moe_ffn(const ModelConfig& cfg, const WeightLoader& w,
                                                  int layer) {
  auto f = std::make_unique<MoeFfn>();
  LOOM_RETURN_IF_ERROR(f->load(cfg, w, layer));
  return f;
}

}  // namespace loom
