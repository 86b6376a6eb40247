// Model::load: builds every layer from the config and a weight source.
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "engine/model/model.h"
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

}  // namespace loom
