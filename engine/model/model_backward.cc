// The backward of both residual schemes, from the gradient of the final normalised rows to the
// embedding's, every layer last first (model_training.cc runs the forward and the loss around
// them). Layers recompute their insides from their taped input (Mixer::backward), so the tape
// holds O(layers * tokens * hidden) floats and no per-token recurrent state.
#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "engine/model/model.h"
#include "kernels/activation.h"
#include "kernels/attnres.h"
#include "kernels/elementwise.h"
#include "kernels/norm.h"

namespace loom {
namespace {

const Tensor& taped(const ActivationTape& tape, int layer, std::string_view name) {
  const Tensor* t = tape.find(layer, name);
  LOOM_CHECK(t != nullptr, "training: the forward recorded no %.*s for layer %d",
             static_cast<int>(name.size()), name.data(), layer);
  return *t;
}

// `status` with the layer it came from in front, so a refusal names the layer.
absl::Status in_layer(absl::Status status, int layer, std::string_view what) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat("layer ", layer, " ", absl_sv(what), ": ", status.message()));
}

// A copy of `t` in step memory.
Tensor copy_of(const ForwardContext& ctx, const Tensor& t) {
  Tensor out = ctx.take(t.shape());
  copy_columns(ctx.ex, t.reshape({t.dim(0), t.numel() / t.dim(0)}), 0,
               out.reshape({t.dim(0), t.numel() / t.dim(0)}));
  return out;
}

}  // namespace

absl::Status Model::backward_plain_residual(const ForwardContext& ctx, const ActivationTape& tape,
                                            const Tensor& d_normed, const Tensor& d_embedding,
                                            Gradients& grads) const {
  const float eps = cfg_.rms_norm_eps, offset = cfg_.norm_weight_offset;
  const int64_t n = d_normed.dim(0), d = d_normed.dim(1);
  const int L = cfg_.num_layers;
  // d_h: the gradient of the residual stream, walked from the output down to the embedding.
  const Tensor& d_h = d_embedding;
  Tensor h = copy_of(ctx, taped(tape, L - 1, "residual"));  // the stream after the last layer
  add_inplace(ctx.ex, h, taped(tape, L - 1, "mixer_out"));
  add_inplace(ctx.ex, h, taped(tape, L - 1, "ffn_out"));
  rmsnorm_backward(ctx.ex, h, final_norm_, eps, offset, d_normed, d_h,
                   grads.get("final_norm.weight", final_norm_.shape()));
  Tensor d_in = ctx.take({n, d}), d_norm_in = ctx.take({n, d});
  for (int l = L - 1; l >= 0; --l) {
    const Layer& layer = layers_[l];
    const std::string p = absl::StrCat("layers.", l, ".");
    const Tensor& residual = taped(tape, l, "residual");
    Tensor mid = copy_of(ctx, residual);  // the stream between the mixer and the FFN
    add_inplace(ctx.ex, mid, taped(tape, l, "mixer_out"));
    LOOM_RETURN_IF_ERROR(
        in_layer(layer.ffn->backward(ctx, taped(tape, l, "ffn_in"), d_h, d_in, grads), l, "FFN"));
    rmsnorm_backward(ctx.ex, mid, layer.ffn_norm, eps, offset, d_in, d_norm_in,
                     grads.get(p + "ffn_norm.weight", layer.ffn_norm.shape()));
    add_inplace(ctx.ex, d_h, d_norm_in);
    LOOM_RETURN_IF_ERROR(
        layer.mixer->backward(ctx, taped(tape, l, "mixer_in"), l, d_h, d_in, grads));
    rmsnorm_backward(ctx.ex, residual, layer.mixer_norm, eps, offset, d_in, d_norm_in,
                     grads.get(p + "mixer_norm.weight", layer.mixer_norm.shape()));
    add_inplace(ctx.ex, d_h, d_norm_in);
  }
  return absl::OkStatus();
}

// Block AttnRes (see run_block_attnres). Sublayer s (mixer 2l, FFN 2l + 1) adds delta_s; block k
// (1-based) is the sum of the deltas of sublayers [(k - 1) B, k B) and is complete for every
// aggregation after the one at k B. The aggregation feeding sublayer a (and the final one, a = 2L)
// reads the embedding, the complete blocks 1 .. k_a - 1 and, last, the running sum of block
// k_a = (a - 1) / B + 1 up to delta_{a-1}. So the gradient of delta_s, in block k, is what the
// aggregations a > s of its own block gave their last source, plus what later blocks'
// aggregations gave entry k: both are accumulated while a walks down, before sublayer a - 1's
// backward needs them.
absl::Status Model::backward_block_attnres(const ForwardContext& ctx, const ActivationTape& tape,
                                           const Tensor& d_normed, const Tensor& d_embedding,
                                           Gradients& grads) const {
  const int64_t n = d_normed.dim(0), d = d_normed.dim(1);
  const int L = cfg_.num_layers, B = cfg_.attnres_block_size, last = 2 * L;
  const float eps = cfg_.rms_norm_eps;
  auto delta = [&](int s) -> const Tensor& {
    return taped(tape, s / 2, s % 2 == 0 ? "mixer_out" : "ffn_out");
  };
  const int64_t capacity = 2 + (2 * int64_t{L} - 1) / B;
  Tensor stack = ctx.take({capacity, n, d});
  copy_columns(ctx.ex, taped(tape, -1, "embedding"), 0, stack.select(0));
  // The complete blocks, summed in the forward's order.
  for (int64_t k = 1; k * B <= last - 1; ++k) {
    copy_columns(ctx.ex, delta(static_cast<int>((k - 1) * B)), 0, stack.select(k));
    for (int64_t s = (k - 1) * B + 1; s < k * B; ++s)
      add_inplace(ctx.ex, stack.select(k), delta(static_cast<int>(s)));
  }
  Tensor d_block = ctx.take({capacity, n, d}), d_running = ctx.take({capacity, n, d});
  zero_fill(ctx.ex, d_block);
  zero_fill(ctx.ex, d_running);
  zero_fill(ctx.ex, d_embedding);
  Tensor d_x = copy_of(ctx, d_normed);  // the gradient of aggregation a's output
  Tensor d_sources = ctx.take({capacity, n, d}), d_in = ctx.take({n, d});
  Tensor d_delta = ctx.take({n, d});
  for (int a = last; a >= 1; --a) {
    const int64_t k = (a - 1) / B + 1;
    // The running sum of block k up to delta_{a-1}, as the forward had it at aggregation a.
    copy_columns(ctx.ex, delta(static_cast<int>((k - 1) * B)), 0, stack.select(k));
    for (int64_t s = (k - 1) * B + 1; s < a; ++s)
      add_inplace(ctx.ex, stack.select(k), delta(static_cast<int>(s)));
    const Tensor sources = stack.slice(0, 0, k + 1);
    const Tensor d_src = d_sources.slice(0, 0, k + 1);
    if (a == last) {
      attnres_aggregate_backward(ctx.ex, sources, final_res_proj_, final_res_norm_, final_norm_,
                                 eps, d_x, d_src,
                                 grads.get("final_res_proj.weight", final_res_proj_.shape()),
                                 grads.get("final_res_norm.weight", final_res_norm_.shape()),
                                 grads.get("final_norm.weight", final_norm_.shape()));
    } else {
      const Layer& layer = layers_[a / 2];
      const bool mixer = a % 2 == 0;
      const std::string p = absl::StrCat("layers.", a / 2, mixer ? ".mixer_" : ".ffn_");
      const Tensor& query = mixer ? layer.mixer_res_proj : layer.ffn_res_proj;
      const Tensor& key_norm = mixer ? layer.mixer_res_norm : layer.ffn_res_norm;
      const Tensor& pre_norm = mixer ? layer.mixer_norm : layer.ffn_norm;
      attnres_aggregate_backward(ctx.ex, sources, query, key_norm, pre_norm, eps, d_x, d_src,
                                 grads.get(p + "res_proj.weight", query.shape()),
                                 grads.get(p + "res_norm.weight", key_norm.shape()),
                                 grads.get(p + "norm.weight", pre_norm.shape()));
    }
    add_inplace(ctx.ex, d_embedding, d_src.select(0));
    for (int64_t i = 1; i < k; ++i) add_inplace(ctx.ex, d_block.select(i), d_src.select(i));
    add_inplace(ctx.ex, d_running.select(k), d_src.select(k));

    // Sublayer a - 1, whose delta is in block k.
    const int s = a - 1;
    copy_columns(ctx.ex, d_running.select(k), 0, d_delta);
    add_inplace(ctx.ex, d_delta, d_block.select(k));
    const Layer& layer = layers_[s / 2];
    if (s % 2 == 0) {
      LOOM_RETURN_IF_ERROR(
          layer.mixer->backward(ctx, taped(tape, s / 2, "mixer_in"), s / 2, d_delta, d_in, grads));
    } else {
      LOOM_RETURN_IF_ERROR(
          in_layer(layer.ffn->backward(ctx, taped(tape, s / 2, "ffn_in"), d_delta, d_in, grads),
                   s / 2, "FFN"));
    }
    if (s == 0) {
      // The first sublayer reads the normalised embedding directly.
      rmsnorm_backward(ctx.ex, taped(tape, -1, "embedding"), layer.mixer_norm, eps,
                       cfg_.norm_weight_offset, d_in, d_x,
                       grads.get("layers.0.mixer_norm.weight", layer.mixer_norm.shape()));
      add_inplace(ctx.ex, d_embedding, d_x);
    } else {
      copy_columns(ctx.ex, d_in, 0, d_x);
    }
  }
  return absl::OkStatus();
}

}  // namespace loom
