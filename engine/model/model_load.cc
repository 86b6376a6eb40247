// Model::load: builds every layer from the config and a weight source.
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "engine/model/model.h"
#include "engine/parallel/expert_dispatcher_binding.h"
#include "kernels/exec.h"
#include "weights/weight_loader.h"

namespace loom {

namespace {

// The activation dtype of a placement whose matrix dtype is resolved (parameter_arena.h).
absl::StatusOr<DType> resolve_activations(const Placement& p) {
  // FP8 matrices are read against bf16 (or f32) activations, as bf16 ones are (W8A16).
  const bool bf16_matrices = p.matrix_dtype() == DType::kBF16 || p.matrix_dtype() == DType::kF8E4M3;
  switch (p.activations) {
    case ActivationDType::kAuto:
      return !p.device.is_cpu() && bf16_matrices ? DType::kBF16 : DType::kF32;
    case ActivationDType::kF32:
      return DType::kF32;
    case ActivationDType::kBF16:
      if (p.device.is_cpu())
        return absl::InvalidArgumentError(
            "bf16 activations need a GPU: the CPU backend computes in f32 (use f32 or auto)");
      if (!bf16_matrices)
        return absl::InvalidArgumentError(
            "bf16 activations need bf16 or fp8 matrices (the GEMMs read bf16 inputs against "
            "bf16 or fp8 weights): load with bf16, fp8 or auto weights");
      if (p.trainable)
        return absl::InvalidArgumentError("a trainable model computes in f32 activations");
      return DType::kBF16;
  }
  return absl::InvalidArgumentError("unknown activation dtype");
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> Model::load(const std::string& dir,
                                                   const Placement& placement) {
  LOOM_ASSIGN_OR_RETURN(ModelConfig cfg, load_model_config(dir));
  return load(dir, cfg, placement);
}

absl::StatusOr<std::unique_ptr<Model>> Model::load(const std::string& dir, const ModelConfig& cfg,
                                                   const Placement& placement) {
  LOOM_ASSIGN_OR_RETURN(WeightLoader w, WeightLoader::open(dir, cfg));
  return load(cfg, w, placement);
}

// Every parameter goes into the model's arena: the GEMM matrices (w.load_matrix, the routed
// experts through w.load_experts) in the placement's dtype, everything else in f32 (w.load). The
// list of which is which is in weights/parameter_arena.h (Placement).
absl::StatusOr<std::unique_ptr<Model>> Model::load(const ModelConfig& cfg,
                                                   const WeightLoader& weights,
                                                   const Placement& placement) {
  LOOM_RETURN_IF_ERROR(cfg.validate());
  LOOM_RETURN_IF_ERROR(device_available(placement.device));
  if (placement.trainable && placement.dtype == WeightDType::kBF16)
    return absl::InvalidArgumentError(
        "a trainable model keeps f32 master weights: load it with f32 (or auto) matrices");
  if (!placement.expert_slots.empty() && !expert_dispatcher_bound())
    return absl::InvalidArgumentError(
        "a placement of expert slots needs an expert-parallel dispatcher bound to this thread "
        "(ScopedExpertDispatcher, engine/parallel/expert_load_balancer.h) to map experts to slots");
  std::unique_ptr<Model> m(new Model(cfg));
  m->arena_ = std::make_unique<ParameterArena>(placement.device);
  LOOM_ASSIGN_OR_RETURN(const WeightLoader w, weights.placed(*m->arena_, placement));
  m->placement_ = w.placement();
  LOOM_ASSIGN_OR_RETURN(m->act_dtype_, resolve_activations(m->placement_));
  m->placement_.activations =
      m->act_dtype_ == DType::kBF16 ? ActivationDType::kBF16 : ActivationDType::kF32;
  const int64_t d = cfg.hidden_size, v = cfg.vocab_size;
  LOOM_ASSIGN_OR_RETURN(m->embed_, w.load("embed.weight", {v, d}));  // embedding_forward: f32
  LOOM_ASSIGN_OR_RETURN(m->final_norm_, w.load("final_norm.weight", {d}));
  LOOM_ASSIGN_OR_RETURN(m->lm_head_, w.load_matrix("lm_head.weight", {v, d}));
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
  m->arena_->freeze(/*read_only=*/!placement.trainable && !placement.writable);
  return m;
}

}  // namespace loom
