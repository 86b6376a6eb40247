#include "engine/model/model.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/activation.h"
#include "kernels/attnres.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "weights/weight_loader.h"

namespace loom {

absl::StatusOr<std::unique_ptr<Model>> Model::load(const std::string& dir) {
  LOOM_ASSIGN_OR_RETURN(ModelConfig cfg, load_model_config(dir));
  return load(dir, cfg);
}

absl::StatusOr<std::unique_ptr<Model>> Model::load(const std::string& dir, const ModelConfig& cfg) {
  LOOM_ASSIGN_OR_RETURN(WeightLoader w, WeightLoader::open(dir, cfg));
  return load(cfg, w);
}

absl::StatusOr<std::unique_ptr<Model>> Model::load(const ModelConfig& cfg, const WeightLoader& w) {
  LOOM_RETURN_IF_ERROR(cfg.validate());
  std::unique_ptr<Model> m(new Model(cfg));
  const int64_t d = cfg.hidden_size, v = cfg.vocab_size;
  LOOM_ASSIGN_OR_RETURN(m->embed_, w.load("embed.weight", {v, d}));
  LOOM_ASSIGN_OR_RETURN(m->final_norm_, w.load("final_norm.weight", {d}));
  LOOM_ASSIGN_OR_RETURN(m->lm_head_, w.load("lm_head.weight", {v, d}));
  if (cfg.attnres_block_size > 0) {
    LOOM_ASSIGN_OR_RETURN(m->final_res_proj_, w.load("final_res_proj.weight", {d}));
    LOOM_ASSIGN_OR_RETURN(m->final_res_norm_, w.load("final_res_norm.weight", {d}));
  }
  m->layers_.resize(cfg.num_layers);
  for (int l = 0; l < cfg.num_layers; ++l) {
    Layer& layer = m->layers_[l];
    const std::string p = absl::StrCat("layers.", l, ".");
    LOOM_ASSIGN_OR_RETURN(layer.mixer_norm, w.load(p + "mixer_norm.weight", {d}));
    LOOM_ASSIGN_OR_RETURN(layer.ffn_norm, w.load(p + "ffn_norm.weight", {d}));
    if (cfg.attnres_block_size > 0) {
      LOOM_ASSIGN_OR_RETURN(layer.mixer_res_proj, w.load(p + "mixer_res_proj.weight", {d}));
      LOOM_ASSIGN_OR_RETURN(layer.mixer_res_norm, w.load(p + "mixer_res_norm.weight", {d}));
      LOOM_ASSIGN_OR_RETURN(layer.ffn_res_proj, w.load(p + "ffn_res_proj.weight", {d}));
      LOOM_ASSIGN_OR_RETURN(layer.ffn_res_norm, w.load(p + "ffn_res_norm.weight", {d}));
    }
    switch (cfg.mixers[l]) {
      case MixerType::kKda: {
        LOOM_ASSIGN_OR_RETURN(layer.mixer, make_kda_mixer(cfg, w, l));
        break;
      }
      case MixerType::kMla: {
        LOOM_ASSIGN_OR_RETURN(layer.mixer, make_mla_mixer(cfg, w, l));
        break;
      }
      case MixerType::kGdn: {
        LOOM_ASSIGN_OR_RETURN(layer.mixer, make_gdn_mixer(cfg, w, l));
        break;
      }
      case MixerType::kGqa: {
        LOOM_ASSIGN_OR_RETURN(layer.mixer, make_gqa_mixer(cfg, w, l));
        break;
      }
    }
    if (cfg.ffns[l] == FfnType::kDense) {
      LOOM_ASSIGN_OR_RETURN(layer.ffn, make_dense_ffn(cfg, w, p + "mlp.", cfg.intermediate_size));
    } else {
      LOOM_ASSIGN_OR_RETURN(layer.ffn, make_moe_ffn(cfg, w, l));
    }
  }
  return m;
}

absl::StatusOr<BatchLayout> Model::make_layout(const ForwardBatch& batch, StepData& step) const {
  BatchLayout layout;
  layout.store = batch.store;
  bool needs_slots = false, needs_pages = false;
  for (MixerType m : cfg_.mixers) {
    needs_slots |= m == MixerType::kKda || m == MixerType::kGdn;
    needs_pages |= m == MixerType::kMla || m == MixerType::kGqa;
  }
  StepShape shape;
  shape.seqs = static_cast<int64_t>(batch.seqs.size());
  int64_t rows = 0;
  // Pages written this call (by any sequence) and slots used: no two sequences may share one.
  // Attention writes every sequence's rows before any sequence attends, so a page one sequence
  // reads may not be written by another either.
  absl::flat_hash_set<int32_t> written_pages, used_slots;
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const SequenceInput& in = batch.seqs[s];
    if (in.num_tokens <= 0)
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, " has no new tokens"));
    if (batch.store == nullptr)
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", s, " has neither a cache nor a cache store"));
    if (in.start < 0)
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, " starts at ", in.start));
    const int64_t past = in.start;
    if (needs_slots) {
      if (in.slot < 0 || in.slot >= batch.store->num_slots())
        return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": state slot ", in.slot,
                                                       " outside [0, ", batch.store->num_slots(),
                                                       ")"));
      if (!used_slots.insert(in.slot).second)
        return absl::InvalidArgumentError(
            absl::StrCat("state slot ", in.slot, " is used by two sequences"));
    }
    if (needs_pages) {
      const int64_t ps = batch.store->page_size();
      const int64_t need = (past + in.num_tokens + ps - 1) / ps;
      if (static_cast<int64_t>(in.pages.size()) < need)
        return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": ", in.pages.size(),
                                                       " pages cannot hold ", past + in.num_tokens,
                                                       " positions"));
      for (int64_t p = 0; p < need; ++p) {
        const int32_t id = in.pages[p];
        if (id < 0 || id >= batch.store->num_pages())
          return absl::InvalidArgumentError(absl::StrCat(
              "sequence ", s, ": page ", id, " outside [0, ", batch.store->num_pages(), ")"));
        if (p >= past / ps && !written_pages.insert(id).second)
          return absl::InvalidArgumentError(
              absl::StrCat("page ", id, " is written by two sequences in one batch"));
      }
      shape.page_cols = std::max(shape.page_cols, need);
    }
    rows += in.num_tokens;
    shape.logit_rows += in.logits == LogitsMode::kAll    ? in.num_tokens
                        : in.logits == LogitsMode::kLast ? 1
                                                         : 0;
  }
  if (needs_pages) {
    const int64_t ps = batch.store->page_size();
    for (size_t s = 0; s < batch.seqs.size(); ++s) {
      const SequenceInput& in = batch.seqs[s];
      for (int64_t p = 0; p < in.start / ps; ++p)
        if (written_pages.contains(in.pages[p]))
          return absl::InvalidArgumentError(absl::StrCat(
              "page ", in.pages[p], " is read by sequence ", s, " and written by another"));
    }
  }
  if (rows != static_cast<int64_t>(batch.token_ids.size()))
    return absl::InvalidArgumentError(absl::StrCat("sequence lengths sum to ", rows, " but ",
                                                   batch.token_ids.size(), " token ids given"));
  for (size_t i = 0; i < batch.token_ids.size(); ++i) {
    const int32_t id = batch.token_ids[i];
    if (id < 0 || id >= cfg_.vocab_size)
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " at position ", i,
                                                     " is outside [0, ", cfg_.vocab_size, ")"));
  }
  layout.num_rows = rows;

  // Valid: pack the step data once.
  shape.tokens = rows;
  step.begin(shape);
  int32_t* ids = step.token_ids.data<int32_t>();
  int64_t* positions = step.positions.data<int64_t>();
  int64_t* logit_rows = step.logit_rows.data<int64_t>();
  int64_t* cu = step.cu_seqlens.data<int64_t>();
  int32_t* table = step.page_table.data<int32_t>();
  std::copy(batch.token_ids.begin(), batch.token_ids.end(), ids);
  int64_t r = 0, b = 0;
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const SequenceInput& in = batch.seqs[s];
    const int64_t n = in.num_tokens;
    cu[s] = b;
    step.past_lens.data<int64_t>()[s] = in.start;
    step.state_slots.data<int32_t>()[s] = in.slot;
    for (int64_t i = 0; i < n; ++i) positions[b + i] = in.start + i;
    if (in.logits == LogitsMode::kAll) {
      for (int64_t i = 0; i < n; ++i) logit_rows[r++] = b + i;
    } else if (in.logits == LogitsMode::kLast) {
      logit_rows[r++] = b + n - 1;
    }
    int32_t* row = table + static_cast<int64_t>(s) * shape.page_cols;
    const int64_t used = std::min<int64_t>(shape.page_cols, in.pages.size());
    std::copy(in.pages.begin(), in.pages.begin() + used, row);
    std::fill(row + used, row + shape.page_cols, 0);
    b += n;
  }
  cu[batch.seqs.size()] = rows;
  step.publish();
  layout.positions = step.positions;
  layout.logit_rows = step.logit_rows;
  layout.cu_seqlens = step.cu_seqlens;
  layout.past_lens = step.past_lens;
  layout.state_slots = step.state_slots;
  layout.page_table = step.page_table;
  return layout;
}

absl::StatusOr<Tensor> Model::forward(const ForwardBatch& batch,
                                      std::vector<Tensor>* hidden) const {
  size_t private_caches = 0;
  for (const SequenceInput& in : batch.seqs) private_caches += in.cache != nullptr;
  if (private_caches == 0) return forward_store(batch, hidden);
  if (private_caches != batch.seqs.size())
    return absl::InvalidArgumentError(
        "a batch mixes sequences with private caches and sequences in the cache store");
  return forward_private(batch, hidden);
}

// Layers see only a store, so private caches are run as store sequences. One cache is its own
// one-sequence store (SequenceCache). Several are staged in a store made for the call: sequence i
// gets slot i and page i, a page as long as the longest context, so each sequence's cached rows
// stay one contiguous block and the attention kernels make the same GEMM calls as on the cache
// itself (identical numbers). Staging copies every cached row in and the new rows and states
// back out: O(context) per call, which tools and tests can afford; the engine never stages.
absl::StatusOr<Tensor> Model::forward_private(const ForwardBatch& batch,
                                              std::vector<Tensor>* hidden) const {
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
  staged.seqs.resize(n);
  for (size_t s = 0; s < n; ++s) {
    const SequenceInput& in = batch.seqs[s];
    SequenceInput& out = staged.seqs[s];
    out.num_tokens = in.num_tokens;
    out.logits = in.logits;
    out.start = in.cache->num_tokens();
    out.slot = n == 1 ? 0 : static_cast<int32_t>(s);
    out.pages = {out.slot};
  }

  if (n == 1) {
    SequenceCache& cache = *batch.seqs[0].cache;
    cache.reserve(batch.seqs[0].num_tokens);
    staged.store = &cache.store();
    absl::StatusOr<Tensor> logits = forward_store(staged, hidden);
    if (logits.ok()) cache.advance(batch.seqs[0].num_tokens);
    return logits;
  }

  int64_t longest = 1;
  for (const SequenceInput& in : batch.seqs)
    longest = std::max(longest, in.cache->num_tokens() + in.num_tokens);
  CacheStore store(cfg_, {.num_pages = static_cast<int64_t>(n),
                          .page_size = longest,
                          .num_slots = static_cast<int64_t>(n)});
  for (size_t s = 0; s < n; ++s) {
    const SequenceCache& cache = *batch.seqs[s].cache;
    store.copy_slot(cache.store(), 0, static_cast<int64_t>(s));
    store.copy_page_rows(cache.store(), 0, static_cast<int64_t>(s), 0, cache.num_tokens());
  }
  staged.store = &store;
  absl::StatusOr<Tensor> logits = forward_store(staged, hidden);
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

absl::StatusOr<Tensor> Model::forward_store(const ForwardBatch& batch,
                                            std::vector<Tensor>* hidden) const {
  // Without the caller's step data and workspace (tools, tests) the call uses its own, and the
  // logits it returns own their memory.
  std::unique_ptr<StepData> own_step;
  StepData* step = batch.step;
  if (step == nullptr) {
    own_step = std::make_unique<StepData>(Device::kCpu);
    step = own_step.get();
  }
  // Validate everything before touching any cache, so a bad batch changes nothing.
  LOOM_ASSIGN_OR_RETURN(BatchLayout layout, make_layout(batch, *step));
  const int64_t rows = layout.num_rows;
  if (rows == 0) return Tensor::empty({0, cfg_.vocab_size});

  std::unique_ptr<Workspace> own_ws;
  Workspace* ws = batch.workspace;
  if (ws == nullptr) {
    own_ws = std::make_unique<Workspace>(Device::kCpu);
    ws = own_ws.get();
  }
  ws->reset();
  Exec ex;
  ex.workspace = ws;
  ex.batch_invariant = batch.batch_invariant;
  const ForwardContext ctx{ex, layout};

  const int64_t d = cfg_.hidden_size;
  Tensor embedding = ctx.take({rows, d});
  embedding_forward(ctx.ex, step->token_ids, embed_, embedding);
  // `normed`: the final normalised hidden state of every row.
  Tensor normed = cfg_.attnres_block_size > 0 ? run_block_attnres(ctx, embedding)
                                              : run_plain_residual(ctx, embedding, hidden);
  const int64_t m = layout.logit_rows.dim(0);
  Tensor picked = ctx.take({m, d});
  gather_rows(ctx.ex, normed, layout.logit_rows, picked);
  Tensor logits = ctx.take({m, cfg_.vocab_size});
  linear_forward(ctx.ex, picked, lm_head_, logits);
  return own_ws ? logits.clone() : logits;
}

Tensor Model::run_plain_residual(const ForwardContext& ctx, Tensor h,
                                 std::vector<Tensor>* hidden) const {
  const int64_t rows = h.dim(0), d = h.dim(1);
  Tensor xn = ctx.take({rows, d});
  Tensor delta = ctx.take({rows, d});
  if (hidden) hidden->clear();
  for (int l = 0; l < cfg_.num_layers; ++l) {
    const Layer& layer = layers_[l];
    if (hidden) hidden->push_back(h.clone());
    rmsnorm_forward(ctx.ex, h, layer.mixer_norm, cfg_.rms_norm_eps, cfg_.norm_weight_offset, xn);
    layer.mixer->forward(ctx, xn, l, delta);
    add_inplace(ctx.ex, h, delta);
    rmsnorm_forward(ctx.ex, h, layer.ffn_norm, cfg_.rms_norm_eps, cfg_.norm_weight_offset, xn);
    layer.ffn->forward(ctx, xn, delta);
    add_inplace(ctx.ex, h, delta);
  }
  rmsnorm_forward(ctx.ex, h, final_norm_, cfg_.rms_norm_eps, cfg_.norm_weight_offset, h);
  if (hidden) hidden->push_back(h.clone());
  return h;
}

// Sublayers are numbered attn = 2l, mlp = 2l + 1. `states` holds the completed block sums (the
// embedding first), `partial` the running sum of the current block's sublayer outputs (undefined
// right after a block boundary). Each sublayer's input is the softmax-over-depth aggregation of
// states + [partial], normalised with the sublayer's own pre-norm weight.
Tensor Model::run_block_attnres(const ForwardContext& ctx, const Tensor& embedding) const {
  const int64_t rows = embedding.dim(0), d = embedding.dim(1);
  const int block = cfg_.attnres_block_size;
  const float eps = cfg_.rms_norm_eps;
  std::vector<Tensor> states = {embedding};
  Tensor partial;
  Tensor xn = ctx.take({rows, d});
  Tensor delta = ctx.take({rows, d});
  auto accumulate = [&]() {
    if (partial.defined()) {
      add_inplace(ctx.ex, partial, delta);
    } else {
      partial = ctx.take({rows, d});
      partial.copy_from(delta);
    }
  };
  auto aggregate_input = [&](int sublayer, const Tensor& query, const Tensor& key_norm,
                             const Tensor& pre_norm) {
    std::vector<Tensor> sources = states;
    sources.push_back(partial);
    if (sublayer % block == 0) {
      states = sources;
      partial = Tensor();
    }
    attnres_aggregate(ctx.ex, sources, query, key_norm, pre_norm, eps, xn);
  };
  for (int l = 0; l < cfg_.num_layers; ++l) {
    const Layer& layer = layers_[l];
    if (l == 0) {
      rmsnorm_forward(ctx.ex, embedding, layer.mixer_norm, eps, cfg_.norm_weight_offset, xn);
    } else {
      aggregate_input(2 * l, layer.mixer_res_proj, layer.mixer_res_norm, layer.mixer_norm);
    }
    layer.mixer->forward(ctx, xn, l, delta);
    accumulate();
    aggregate_input(2 * l + 1, layer.ffn_res_proj, layer.ffn_res_norm, layer.ffn_norm);
    layer.ffn->forward(ctx, xn, delta);
    accumulate();
  }
  std::vector<Tensor> sources = states;
  sources.push_back(partial);
  Tensor out = ctx.take({rows, d});
  attnres_aggregate(ctx.ex, sources, final_res_proj_, final_res_norm_, final_norm_, eps, out);
  return out;
}

}  // namespace loom
