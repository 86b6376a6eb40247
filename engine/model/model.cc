#include "engine/model/model.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/activation.h"
#include "kernels/attnres.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"

namespace loom {

absl::StatusOr<Tensor> Model::forward(const ForwardBatch& batch, ActivationTape* tape) const {
  size_t private_caches = 0;
  for (const SequenceInput& in : batch.seqs) private_caches += in.cache != nullptr;
  if (private_caches == 0) return forward_store(batch, tape);
  if (private_caches != batch.seqs.size())
    return absl::InvalidArgumentError(
        "a batch mixes sequences with private caches and sequences in the cache store");
  return forward_private(batch, tape);
}

// Layers see only a store, so private caches are run as store sequences. One cache is its own
// one-sequence store (SequenceCache). Several are staged in a store made for the call: sequence i
// gets slot i and page i, a page as long as the longest context, so each sequence's cached rows
// stay one contiguous block and the attention kernels make the same GEMM calls as on the cache
// itself (identical numbers). Staging copies every cached row in and the new rows and states
// back out: O(context) per call, which tools and tests can afford; the engine never stages.
absl::StatusOr<Tensor> Model::forward_private(const ForwardBatch& batch,
                                              ActivationTape* tape) const {
  const size_t n = batch.seqs.size();
  for (size_t s = 0; s < n; ++s)
    for (size_t t = 0; t < s; ++t)
      if (batch.seqs[t].cache == batch.seqs[s].cache)
        return absl::InvalidArgumentError(
            absl::StrCat("sequences ", t, " and ", s, " share one cache"));
  ForwardBatch staged;
  staged.token_ids = batch.token_ids;
  staged.batch_invariant = batch.batch_invariant;
  staged.workspace = batch.workspace;
  staged.step = batch.step;
  staged.routing_replay = batch.routing_replay;
  staged.training = batch.training;
  staged.seqs.resize(n);
  for (size_t s = 0; s < n; ++s) {
    const SequenceInput& in = batch.seqs[s];
    SequenceInput& out = staged.seqs[s];
    out.num_tokens = in.num_tokens;
    out.logits = in.logits;
    out.start = in.cache->num_tokens();
    out.slot = n == 1 ? 0 : static_cast<int32_t>(s);
    out.pages = std::span<const int32_t>(&out.slot, 1);  // page s is slot s: one id, kept in place
  }

  if (n == 1) {
    SequenceCache& cache = *batch.seqs[0].cache;
    cache.reserve(batch.seqs[0].num_tokens);
    staged.store = &cache.store();
    absl::StatusOr<Tensor> logits = forward_store(staged, tape);
    if (logits.ok()) cache.advance(batch.seqs[0].num_tokens);
    return logits;
  }

  int64_t longest = 1;
  for (const SequenceInput& in : batch.seqs)
    longest = std::max(longest, in.cache->num_tokens() + in.num_tokens);
  CacheStore store(cfg_, {.num_pages = static_cast<int64_t>(n),
                          .page_size = longest,
                          .num_slots = static_cast<int64_t>(n),
                          .device = placement_.device,
                          .act_dtype = act_dtype_});
  for (size_t s = 0; s < n; ++s) {
    const SequenceCache& cache = *batch.seqs[s].cache;
    store.copy_slot(cache.store(), 0, static_cast<int64_t>(s));
    store.copy_page_rows(cache.store(), 0, static_cast<int64_t>(s), 0, cache.num_tokens());
  }
  staged.store = &store;
  absl::StatusOr<Tensor> logits = forward_store(staged, tape);
  if (!logits.ok()) return logits;
  for (size_t s = 0; s < n; ++s) {
    SequenceCache& cache = *batch.seqs[s].cache;
    const int64_t past = cache.num_tokens(), added = batch.seqs[s].num_tokens;
    cache.reserve(added);
    cache.store().copy_slot(store, static_cast<int64_t>(s), 0);
    cache.store().copy_page_rows(store, static_cast<int64_t>(s), 0, past, past + added);
    cache.advance(added);
  }
  return logits;
}

absl::Status Model::check_devices(const ForwardBatch& batch) const {
  const Device device = placement_.device;
  if (batch.store != nullptr && batch.store->device() != device)
    return absl::InvalidArgumentError(absl::StrCat("the cache store is on ",
                                                   device_name(batch.store->device()),
                                                   " but the model on ", device_name(device)));
  if (batch.step != nullptr && batch.step->device() != device)
    return absl::InvalidArgumentError(absl::StrCat("the step data is on ",
                                                   device_name(batch.step->device()),
                                                   " but the model on ", device_name(device)));
  if (batch.workspace != nullptr && batch.workspace->device() != device)
    return absl::InvalidArgumentError(absl::StrCat("the workspace is on ",
                                                   device_name(batch.workspace->device()),
                                                   " but the model on ", device_name(device)));
  return absl::OkStatus();
}

absl::StatusOr<Tensor> Model::forward_store(const ForwardBatch& batch, ActivationTape* tape) const {
  // Without the caller's step data and workspace (tools, tests) the call uses its own, and the
  // logits it returns own their memory.
  const Device device = placement_.device;
  LOOM_RETURN_IF_ERROR(check_devices(batch));
  std::unique_ptr<StepData> own_step;
  StepData* step = batch.step;
  if (step == nullptr) {
    own_step = std::make_unique<StepData>(device);
    step = own_step.get();
  }
  std::unique_ptr<Workspace> own_ws;
  Workspace* ws = batch.workspace;
  if (ws == nullptr) {
    own_ws = std::make_unique<Workspace>(device);
    ws = own_ws.get();
  }
  Exec ex = exec_for(device, ws);
  ex.batch_invariant = batch.batch_invariant;
  ex.matmul = matmul_;
  // Validate everything before touching any cache, so a bad batch changes nothing.
  LOOM_ASSIGN_OR_RETURN(BatchLayout layout, make_layout(batch, ex, *step));
  if (batch.routing_replay != nullptr)
    LOOM_RETURN_IF_ERROR(validate_routing_replay(cfg_, *batch.routing_replay, layout.num_rows));
  if (layout.num_rows == 0) return Tensor::empty({0, cfg_.vocab_size}, DType::kF32, device);
  Tensor logits = launch_layers(ex, layout, tape, batch.routing_replay, batch.training);
  return own_ws ? logits.clone() : logits;
}

absl::StatusOr<BatchLayout> Model::prepare(const ForwardBatch& batch) const {
  if (batch.step == nullptr || batch.workspace == nullptr)
    return absl::InvalidArgumentError("Model::prepare needs the batch's step data and workspace");
  for (const SequenceInput& in : batch.seqs)
    if (in.cache != nullptr)
      return absl::InvalidArgumentError("Model::prepare takes store-backed sequences only");
  LOOM_RETURN_IF_ERROR(check_devices(batch));
  Exec ex = exec_for(placement_.device, batch.workspace);
  ex.batch_invariant = batch.batch_invariant;
  ex.matmul = matmul_;
  return make_layout(batch, ex, *batch.step);
}

absl::Status Model::set_matmul_precision(MatmulPrecision precision) {
  if (precision != MatmulPrecision::kF32 && placement_.device.is_cpu())
    return absl::InvalidArgumentError(absl::StrCat(
        precision == MatmulPrecision::kBf16 ? "bf16" : "TF32",
        " matmuls need a CUDA device (the model is on the CPU, which computes in f32)"));
  matmul_ = precision;
  return absl::OkStatus();
}

Tensor Model::launch(const ForwardBatch& batch, const BatchLayout& layout) const {
  Exec ex = exec_for(placement_.device, batch.workspace);
  ex.batch_invariant = batch.batch_invariant;
  ex.matmul = matmul_;
  return launch_layers(ex, layout, nullptr, nullptr, /*training=*/false);
}

Tensor Model::launch_layers(const Exec& ex, const BatchLayout& layout, ActivationTape* tape,
                            RoutingReplay* routing_replay, bool training) const {
  Workspace* ws = ex.workspace;
  const int64_t rows = layout.num_rows;
  ws->reset();
  const ForwardContext ctx{ex, layout, act_dtype_, tape, routing_replay, training};

  const int64_t d = cfg_.hidden_size;
  // The residual stream stays f32 whatever the activations are (Placement::activations).
  Tensor embedding = ctx.take({rows, d}, DType::kF32);
  // make_layout checked every id on the host before the upload.
  embedding_forward(ctx.ex, layout.token_ids, embed_, embedding, EmbeddingIds::kChecked);
  ctx.record(-1, "embedding", embedding);
  // `normed`: the final normalised hidden state of every row.
  Tensor normed = cfg_.attnres_block_size > 0 ? run_block_attnres(ctx, embedding)
                                              : run_plain_residual(ctx, embedding);
  ctx.record(-1, "final_normed", normed);
  const int64_t m = layout.logit_rows.dim(0);
  Tensor picked = ctx.take({m, d});
  gather_rows(ctx.ex, normed, layout.logit_rows, picked);
  Tensor logits = ctx.take({m, cfg_.vocab_size}, DType::kF32);  // the samplers read f32
  linear_forward(ctx.ex, picked, lm_head_, logits);
  return logits;
}

Tensor Model::run_plain_residual(const ForwardContext& ctx, Tensor h) const {
  const int64_t rows = h.dim(0), d = h.dim(1);
  Tensor xn = ctx.take({rows, d});
  Tensor delta = ctx.take({rows, d});
  const float eps = cfg_.rms_norm_eps, offset = cfg_.norm_weight_offset;
  // Each residual add is fused with the norm that reads its sum (the next sublayer's, or the
  // final one, in place), so h is updated and normalised in one pass.
  if (cfg_.num_layers == 0) rmsnorm_forward(ctx.ex, h, final_norm_, eps, offset, h);
  if (cfg_.num_layers > 0) rmsnorm_forward(ctx.ex, h, layers_[0].mixer_norm, eps, offset, xn);
  for (int l = 0; l < cfg_.num_layers; ++l) {
    const Layer& layer = layers_[l];
    ctx.record(l, "residual", h);
    ctx.record(l, "mixer_in", xn);
    layer.mixer->forward(ctx, xn, l, delta);
    ctx.record(l, "mixer_out", delta);
    add_rmsnorm_forward(ctx.ex, h, delta, layer.ffn_norm, eps, offset, xn);
    ctx.record(l, "ffn_in", xn);
    layer.ffn->forward(ctx, xn, delta);
    ctx.record(l, "ffn_out", delta);
    const bool last = l + 1 == cfg_.num_layers;
    add_rmsnorm_forward(ctx.ex, h, delta, last ? final_norm_ : layers_[l + 1].mixer_norm, eps,
                        offset, last ? h : xn);
  }
  return h;
}

// Sublayers are numbered attn = 2l, mlp = 2l + 1. `stack` [S, N, D] holds the completed block
// sums (the embedding first) followed by the running sum of the current block's sublayer outputs,
// so every aggregation reads its sources as one tensor, stack[0, completed + partial). Each
// sublayer's input is the softmax-over-depth aggregation of those, normalised with the sublayer's
// own pre-norm weight; at a block boundary the running sum becomes a completed block.
Tensor Model::run_block_attnres(const ForwardContext& ctx, const Tensor& embedding) const {
  const int64_t rows = embedding.dim(0), d = embedding.dim(1);
  const int block = cfg_.attnres_block_size;
  const float eps = cfg_.rms_norm_eps;
  // The embedding, at most one completed block per `block` aggregated sublayers (1 .. 2L - 1),
  // and the running sum.
  const int64_t capacity = 2 + (2 * int64_t{cfg_.num_layers} - 1) / block;
  Tensor stack = ctx.take({capacity, rows, d}, DType::kF32);  // the residual stream: f32
  copy_columns(ctx.ex, embedding, 0, stack.select(0));
  int64_t completed = 1;
  bool has_partial = false;
  Tensor xn = ctx.take({rows, d});
  Tensor delta = ctx.take({rows, d});
  auto accumulate = [&]() {
    const Tensor partial = stack.select(completed);
    if (has_partial) {
      add_inplace(ctx.ex, partial, delta);
    } else {
      copy_columns(ctx.ex, delta, 0, partial);
      has_partial = true;
    }
  };
  auto sources = [&]() { return stack.slice(0, 0, completed + (has_partial ? 1 : 0)); };
  auto aggregate_input = [&](int sublayer, const Tensor& query, const Tensor& key_norm,
                             const Tensor& pre_norm) {
    attnres_aggregate(ctx.ex, sources(), query, key_norm, pre_norm, eps, xn);
    if (sublayer % block == 0 && has_partial) {
      ++completed;
      has_partial = false;
    }
  };
  for (int l = 0; l < cfg_.num_layers; ++l) {
    const Layer& layer = layers_[l];
    if (l == 0) {
      rmsnorm_forward(ctx.ex, embedding, layer.mixer_norm, eps, cfg_.norm_weight_offset, xn);
    } else {
      aggregate_input(2 * l, layer.mixer_res_proj, layer.mixer_res_norm, layer.mixer_norm);
    }
    ctx.record(l, "mixer_in", xn);
    layer.mixer->forward(ctx, xn, l, delta);
    ctx.record(l, "mixer_out", delta);
    accumulate();
    aggregate_input(2 * l + 1, layer.ffn_res_proj, layer.ffn_res_norm, layer.ffn_norm);
    ctx.record(l, "ffn_in", xn);
    layer.ffn->forward(ctx, xn, delta);
    ctx.record(l, "ffn_out", delta);
    accumulate();
  }
  Tensor out = ctx.take({rows, d});
  attnres_aggregate(ctx.ex, sources(), final_res_proj_, final_res_norm_, final_norm_, eps, out);
  return out;
}

}  // namespace loom
