#include "engine/model/model.h"

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"
#include "kernels/activation.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "weights/weight_loader.h"

namespace loom {

absl::StatusOr<std::unique_ptr<Model>> Model::load(const std::string& dir) {
  LOOM_ASSIGN_OR_RETURN(ModelConfig cfg, load_model_config(dir));
  return load(dir, cfg);
}

absl::StatusOr<std::unique_ptr<Model>> Model::load(const std::string& dir,
                                                   const ModelConfig& cfg) {
  LOOM_RETURN_IF_ERROR(cfg.validate());
  LOOM_ASSIGN_OR_RETURN(WeightLoader w, WeightLoader::open(dir, cfg));
  std::unique_ptr<Model> m(new Model(cfg));
  const int64_t d = cfg.hidden_size, v = cfg.vocab_size;
  LOOM_ASSIGN_OR_RETURN(m->embed_, w.load("embed.weight", {v, d}));
  LOOM_ASSIGN_OR_RETURN(m->final_norm_, w.load("final_norm.weight", {d}));
  LOOM_ASSIGN_OR_RETURN(m->lm_head_, w.load("lm_head.weight", {v, d}));
  m->layers_.resize(cfg.num_layers);
  for (int l = 0; l < cfg.num_layers; ++l) {
    Layer& layer = m->layers_[l];
    const std::string p = absl::StrCat("layers.", l, ".");
    LOOM_ASSIGN_OR_RETURN(layer.mixer_norm, w.load(p + "mixer_norm.weight", {d}));
    LOOM_ASSIGN_OR_RETURN(layer.ffn_norm, w.load(p + "ffn_norm.weight", {d}));
    switch (cfg.mixers[l]) {
      case MixerType::kKda: {
        LOOM_ASSIGN_OR_RETURN(layer.mixer, make_kda_mixer(cfg, w, l));
        break;
      }
      case MixerType::kMla: {
        LOOM_ASSIGN_OR_RETURN(layer.mixer, make_mla_mixer(cfg, w, l));
        break;
      }
      default:
        return absl::UnimplementedError(absl::StrCat(
            "layer ", l, ": mixer '", absl_sv(mixer_type_name(cfg.mixers[l])),
            "' is not supported by this build yet"));
    }
    if (cfg.ffns[l] == FfnType::kDense) {
      LOOM_ASSIGN_OR_RETURN(layer.ffn, make_dense_ffn(cfg, w, p + "mlp.", cfg.intermediate_size));
    } else {
      LOOM_ASSIGN_OR_RETURN(layer.ffn, make_moe_ffn(cfg, w, l));
    }
  }
  return m;
}

absl::StatusOr<Tensor> Model::forward(const ForwardBatch& batch,
                                      std::vector<Tensor>* hidden) const {
  // Validate everything before touching any cache, so a bad batch changes nothing.
  BatchLayout layout;
  int64_t rows = 0;
  std::vector<int64_t> logit_rows;
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const SequenceInput& in = batch.seqs[s];
    if (in.cache == nullptr)
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, " has no cache"));
    if (in.num_tokens <= 0)
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, " has no new tokens"));
    for (size_t t = 0; t < s; ++t)
      if (batch.seqs[t].cache == in.cache)
        return absl::InvalidArgumentError(
            absl::StrCat("sequences ", t, " and ", s, " share one cache"));
    layout.start.push_back(rows);
    layout.length.push_back(in.num_tokens);
    layout.caches.push_back(in.cache);
    if (in.logits == LogitsMode::kAll) {
      for (int64_t i = 0; i < in.num_tokens; ++i) logit_rows.push_back(rows + i);
    } else if (in.logits == LogitsMode::kLast) {
      logit_rows.push_back(rows + in.num_tokens - 1);
    }
    rows += in.num_tokens;
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
  if (rows == 0) return Tensor::empty({0, cfg_.vocab_size});

  const int64_t d = cfg_.hidden_size;
  for (size_t s = 0; s < layout.caches.size(); ++s) layout.caches[s]->reserve(layout.length[s]);

  Tensor ids = Tensor::wrap(const_cast<int32_t*>(batch.token_ids.data()), {rows}, DType::kI32);
  Tensor h = Tensor::empty({rows, d});
  embedding_forward(ids, embed_, h);
  Tensor xn = Tensor::empty({rows, d});
  Tensor delta = Tensor::empty({rows, d});
  if (hidden) hidden->clear();
  for (int l = 0; l < cfg_.num_layers; ++l) {
    const Layer& layer = layers_[l];
    if (hidden) hidden->push_back(h.clone());
    rmsnorm_forward(h, layer.mixer_norm, cfg_.rms_norm_eps, cfg_.norm_weight_offset, xn);
    layer.mixer->forward(xn, layout, l, delta);
    add_inplace(h, delta);
    rmsnorm_forward(h, layer.ffn_norm, cfg_.rms_norm_eps, cfg_.norm_weight_offset, xn);
    layer.ffn->forward(xn, delta);
    add_inplace(h, delta);
  }
  for (size_t s = 0; s < layout.caches.size(); ++s) layout.caches[s]->advance(layout.length[s]);

  if (hidden) {
    Tensor all = Tensor::empty({rows, d});
    rmsnorm_forward(h, final_norm_, cfg_.rms_norm_eps, cfg_.norm_weight_offset, all);
    hidden->push_back(all);
  }
  const int64_t m = static_cast<int64_t>(logit_rows.size());
  Tensor picked = Tensor::empty({m, d});
  gather_rows(h, logit_rows, picked);
  rmsnorm_forward(picked, final_norm_, cfg_.rms_norm_eps, cfg_.norm_weight_offset, picked);
  Tensor logits = Tensor::empty({m, cfg_.vocab_size});
  linear_forward(picked, lm_head_, logits);
  return logits;
}

}  // namespace loom
