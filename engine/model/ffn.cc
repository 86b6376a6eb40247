// FFN blocks: the dense SwiGLU MLP and the mixture of experts with shared experts.
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "engine/model/layers.h"
#include "engine/model/training_batch.h"
#include "engine/parallel/expert_dispatcher_binding.h"
#include "kernels/activation.h"
#include "kernels/elementwise.h"
#include "kernels/exec.h"
#include "kernels/gemm.h"
#include "kernels/gemm_backward.h"
#include "kernels/moe.h"
#include "kernels/side_stream.h"

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
    Tensor h = ctx.take({n, width_});
    forward_with(ctx.ex, x, h, out);
  }

  // forward on caller-provided memory for the hidden activations h [rows, width]: MoeFfn runs
  // the shared expert this way on a side stream, whose Exec has no workspace; there both products
  // must be single GEMV kernels (runs_as_gemvs), which take none.
  void forward_with(const Exec& ex, const Tensor& x, const Tensor& h, const Tensor& out) const {
    LOOM_CHECK(
        ex.workspace != nullptr || ex.device.is_cpu() ||
            (linear_swiglu_is_gemv(ex, x, gate_, up_, h) && linear_is_gemv(ex, down_, x.dim(0))),
        "%sforward_with: without a workspace the products must be single GEMV kernels",
        prefix_.c_str());
    linear_swiglu_forward(ex, x, gate_, up_, h);
    linear_forward(ex, h, down_, out);
  }
  // True when forward_with of `rows` rows is two of Loom's GEMV kernels (kernels/side_stream.h's
  // condition for a side-stream branch).
  bool runs_as_gemvs(const Exec& ex, int64_t rows) const {
    return linear_is_gemv(ex, gate_, rows) && linear_is_gemv(ex, up_, rows) &&
           linear_is_gemv(ex, down_, rows);
  }
  int64_t width() const { return width_; }

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
    prefix_ = p;
    layer_ = layer;
    LOOM_ASSIGN_OR_RETURN(router_, w.load(p + "router.weight", {e, d}));
    if (m.has_score_bias) {
      LOOM_ASSIGN_OR_RETURN(bias_, w.load(p + "router.bias", {e}));
    }
    // Only the placement's experts are loaded ([owned, I, D]); the router covers all of them and
    // the dispatcher sends the grouped GEMMs only the slots routed to the owned ones.
    LOOM_ASSIGN_OR_RETURN(w_gate_, w.load_experts(p + "experts.gate", {e, i, d}));
    LOOM_ASSIGN_OR_RETURN(w_up_, w.load_experts(p + "experts.up", {e, i, d}));
    LOOM_ASSIGN_OR_RETURN(w_down_, w.load_experts(p + "experts.down", {e, d, i}));
    // A LocalExpertDispatcher of the placement's experts, or the rank's expert-parallel one
    // (expert_dispatcher_binding.h).
    LOOM_ASSIGN_OR_RETURN(dispatcher_,
                          expert_dispatcher_for_layer(e, w.placement().owned_experts(e)));
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
    // At decode sizes the shared expert (two GEMV kernels) runs on a side stream beside the
    // router, the routing and the routed experts, a chain of small kernels it does not depend
    // on; its output and hidden activations are taken here, before the fork, so that nothing it
    // uses is released while it runs.
    Tensor s, h;  // live until the join below
    Exec side;
    const bool overlap = shared_ != nullptr && shared_->runs_as_gemvs(ctx.ex, n);
    if (shared_) s = ctx.take(out.shape());
    if (overlap) {
      h = ctx.take({n, shared_->width()});
      side = fork_side_stream(ctx.ex);
      shared_->forward_with(side, x, h, s);
    }
    // The router and the shared-expert gate keep f32 weights (parameter_arena.h) and compute in
    // f32 on x's values (bf16 rows are widened exactly inside linear_forward): routing decides on
    // the exact logits whatever the activations are.
    Tensor logits = ctx.take({n, e}, DType::kF32);
    linear_forward(ctx.ex, x, router_, logits);
    Tensor ids = ctx.take({n, params_.top_k}, DType::kI32);
    Tensor weights = ctx.take({n, params_.top_k}, DType::kF32);
    route(ctx, logits, ids, weights, /*count_replay=*/true);
    // The engine's routing record (Request::return_routed_experts) and diagnostics.
    if (ctx.tape != nullptr && ctx.tape->wants("expert_ids"))
      ctx.tape->record(layer_, "expert_ids", ids);
    const Dispatched routed = dispatcher_->dispatch(ctx.ex, x, ids, weights, ctx.ws());
    Tensor y = ctx.take(routed.rows.shape());
    moe_grouped_swiglu(ctx.ex, routed.rows, routed.offsets, w_gate_, w_up_, w_down_, y);
    if (!shared_) {
      dispatcher_->combine(ctx.ex, y, routed, out);
      return;
    }
    if (overlap) {
      join_side_stream(ctx.ex, side);
    } else {
      shared_->forward(ctx, x, s);
    }
    if (shared_gate_.defined()) {
      Tensor g = ctx.take({n, 1}, DType::kF32);
      linear_forward(ctx.ex, x, shared_gate_, g);
      mul_sigmoid_rows(ctx.ex, s, g);
    }
    // out = combine + s, the shared expert's output added to each finished sum (one kernel on
    // the local dispatcher; the bits of combine then add_inplace).
    dispatcher_->combine_add(ctx.ex, y, routed, out, s);
  }

  // Recomputes the router, the routing and the routed experts from x (the gate and up
  // pre-activations and the expert outputs kept for their backwards), then runs the backward:
  // combine (d_y and the gate weights' gradient), the grouped SwiGLU (expert weights), the router
  // (its weight, through the gate weights and, when Gradients asks for it, the auxiliary
  // load-balancing loss; the selection and the bias get no gradient), dispatch (the rows' gradient
  // back to their tokens), and the shared expert with its optional sigmoid gate. d_x sums, in this
  // order, the router's, the routed experts', the shared gate's and the shared expert's parts.
  absl::Status backward(const ForwardContext& ctx, const Tensor& x, const Tensor& d_out,
                        const Tensor& d_x, Gradients& grads) const override {
    for (const Tensor* t : {&router_, &w_gate_, &w_up_, &w_down_})
      if (t->dtype() != DType::kF32)
        return absl::UnimplementedError(absl::StrCat(
            "training: the MoE's router and expert weights must be f32 (", prefix_, ")"));
    if (shared_gate_.defined() && shared_gate_.dtype() != DType::kF32)
      return absl::UnimplementedError("training: the MoE's shared-expert gate must be f32");
    const Workspace::Mark scope(ctx.ws());
    const Exec& ex = ctx.ex;
    const int64_t n = x.dim(0), e = router_.dim(0), k = params_.top_k;
    const int64_t inter = w_gate_.dim(1);
    auto grad = [&](const char* name, const Tensor& of) -> const Tensor& {
      return grads.get(prefix_ + name, of.shape());
    };

    // The forward's routed path, keeping what the backward reads (combine's output is not needed).
    Tensor logits = ctx.take({n, e});
    linear_forward(ex, x, router_, logits);
    Tensor ids = ctx.take({n, k}, DType::kI32), weights = ctx.take({n, k});
    route(ctx, logits, ids, weights, /*count_replay=*/false);
    if (bias_.defined()) {
      // What the quantile balancer tunes the bias from: this pass's tokens per expert.
      std::vector<int64_t> counts(static_cast<size_t>(router_.dim(0)), 0);
      const Tensor host_ids = ids.to(Device::kCpu);
      const int32_t* id = host_ids.data<int32_t>();
      for (int64_t i = 0; i < ids.numel(); ++i) ++counts[static_cast<size_t>(id[i])];
      grads.add_expert_counts(prefix_ + "router.bias", counts);
    }
    const Dispatched routed = dispatcher_->dispatch(ex, x, ids, weights, ctx.ws());
    const int64_t rows = routed.rows.dim(0);
    Tensor y = ctx.take(routed.rows.shape());
    Tensor gate_up = ctx.take({2, rows, inter});
    moe_grouped_swiglu(ex, routed.rows, routed.offsets, w_gate_, w_up_, w_down_, y, gate_up);

    // Backward of the routed path.
    Tensor d_y = ctx.take(routed.rows.shape()), d_weights = ctx.take({n, k});
    dispatcher_->combine_backward(ex, y, routed, d_out, d_y, d_weights);
    Tensor d_rows = y;  // y is read only by combine_backward: its memory takes the rows' gradient
    moe_grouped_swiglu_backward(ex, routed.rows, routed.offsets, w_gate_, w_up_, w_down_, gate_up,
                                d_y, d_rows, grad("experts.gate", w_gate_),
                                grad("experts.up", w_up_), grad("experts.down", w_down_));
    // d_logits takes the logits' memory (moe_route_backward reads each row before writing it),
    // unless the load-balancing loss reads the logits after it.
    const float alpha = grads.aux_loss_alpha();
    Tensor d_logits = alpha > 0.0f ? ctx.take({n, e}) : logits;
    moe_route_backward(ex, logits, ids, params_, d_weights, d_logits);
    if (alpha > 0.0f) {
      // Each sequence's own loss (its load statistics over its rows): a packed batch of several
      // sequences optimises what their separate calls would (Model::loss_and_gradients_packed).
      LOOM_ASSIGN_OR_RETURN(const std::vector<RowSpan> seqs, training_sequences(ctx.batch));
      Tensor aux = ctx.take({1});
      for (const auto& [b, e] : seqs) {
        moe_aux_loss_forward_backward(ex, logits.slice(0, b, e), ids.slice(0, b, e), params_.score,
                                      alpha, aux, d_logits.slice(0, b, e));
        grads.add_aux_loss(aux.to(Device::kCpu).data<float>()[0]);
      }
    }
    linear_backward(ex, x, router_, d_logits, d_x, 0.0f, grad("router.weight", router_));
    dispatcher_->dispatch_backward(ex, d_rows, routed, d_x);

    if (shared_) {
      Tensor d_shared = d_out;
      if (shared_gate_.defined()) {
        // out += s * sigmoid(x . gate): the gate's gradient, and the shared expert's d_out.
        Tensor s = ctx.take(d_out.shape());
        shared_->forward(ctx, x, s);
        Tensor g = ctx.take({n, 1}), d_g = ctx.take({n, 1});
        linear_forward(ex, x, shared_gate_, g);
        d_shared = ctx.take(d_out.shape());
        mul_sigmoid_rows_backward(ex, s, g, d_out, d_shared, d_g);
        linear_backward(ex, x, shared_gate_, d_g, d_x, 1.0f,
                        grad("shared_gate.weight", shared_gate_));
      }
      Tensor d_xs = ctx.take(d_x.shape());
      LOOM_RETURN_IF_ERROR(shared_->backward(ctx, x, d_shared, d_xs, grads));
      add_inplace(ex, d_x, d_xs);
    }
    return absl::OkStatus();
  }

 private:
  // The router's top-k and gate weights from the logits; with a routing replay for this layer,
  // its rows' replayed experts instead, their weights from the same logits (routing_replay.h).
  // `count_replay`: add the replayed and differing slots to the replay's counters (the forward
  // does; the backward's recomputation does not count them again).
  void route(const ForwardContext& ctx, const Tensor& logits, const Tensor& ids,
             const Tensor& weights, bool count_replay) const {
    moe_route(ctx.ex, logits, bias_, params_, ids, weights);
    RoutingReplay* replay = ctx.routing_replay;
    if (replay == nullptr) return;
    const Tensor& host_replayed = replay->expert_ids[static_cast<size_t>(layer_)];
    if (!host_replayed.defined()) return;
    // Measuring in a backward's recomputation: the counters are the forward's, the routing the
    // layer's own; nothing to do.
    if (!replay->apply && !count_replay) return;
    // The replay lives on the host (validated there, routing_replay.h); a GPU forward uploads the
    // layer's rows in stream order.
    Tensor replayed = host_replayed;
    if (!ctx.ex.device.is_cpu()) {
      replayed = ctx.take(host_replayed.shape(), DType::kI32);
      upload_async(ctx.ex, replayed.raw(), host_replayed.raw(), host_replayed.nbytes());
    }
    Tensor counts = ctx.take({2}, DType::kI64);
    if (replay->apply) {
      moe_route_replay(ctx.ex, logits, replayed, params_, ids, weights, counts);
    } else {
      // Measure only: the replay rewrites copies; the layer keeps its own routing.
      Tensor ids_copy = ctx.take(ids.shape(), DType::kI32);
      Tensor weights_copy = ctx.take(weights.shape(), DType::kF32);
      copy_async(ctx.ex, ids_copy.raw(), ids.raw(), ids.nbytes());
      copy_async(ctx.ex, weights_copy.raw(), weights.raw(), weights.nbytes());
      moe_route_replay(ctx.ex, logits, replayed, params_, ids_copy, weights_copy, counts);
    }
    if (!count_replay) return;
    // On a GPU the counters come back at once: a wait per MoE layer of a replayed forward (the
    // trainer's, never the engine's).
    int64_t c[2];
    download(ctx.ex, c, counts.raw(), sizeof c);
    replay->replayed_slots += c[0];
    replay->differing_slots += c[1];
  }

  std::string prefix_;  // "layers.L.moe."
  int layer_ = 0;
  RouterParams params_;
  Tensor router_, bias_, w_gate_, w_up_, w_down_, shared_gate_;
  std::unique_ptr<DenseFfn> shared_;
  std::shared_ptr<ExpertDispatcher> dispatcher_;  // one rank's may serve all its layers
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
