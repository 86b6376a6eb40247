#include "weights/weight_loader.h"

#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "weights/adapters/adapters.h"
#include "weights/fp8.h"

namespace loom {
namespace {

Shape squeeze(const Shape& s) {
  Shape out;
  for (int64_t d : s)
    if (d != 1) out.push_back(d);
  return out;
}

// Converts a host tensor of any float dtype to a contiguous f32 tensor (zero-copy for f32).
absl::StatusOr<Tensor> as_f32(const Tensor& t, std::string_view name) {
  switch (t.dtype()) {
    case DType::kF32:
      return t.is_contiguous() ? t : t.clone();
    case DType::kBF16:
    case DType::kF16:
      return t.to_f32();
    default:
      return absl::InvalidArgumentError(absl::StrCat("tensor '", absl_sv(name), "' has dtype ",
                                                     absl_sv(dtype_name(t.dtype())),
                                                     "; expected a float type"));
  }
}

}  // namespace

absl::StatusOr<WeightLoader> WeightLoader::open(const std::string& dir, const ModelConfig& cfg) {
  LOOM_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::open(dir));
  return WeightLoader(std::make_shared<const Checkpoint>(std::move(ckpt)), cfg);
}

bool WeightLoader::has(std::string_view canonical) const {
  if (!ckpt_) return true;
  absl::StatusOr<TensorSource> src = tensor_source(cfg_, canonical);
  if (!src.ok()) return false;
  for (const std::string& n : src->names)
    if (!ckpt_->contains(n)) return false;
  return !src->names.empty();
}

WeightLoader WeightLoader::synthetic(const ModelConfig& cfg, uint64_t seed) {
  WeightLoader w(nullptr, cfg);
  w.seed_ = seed;
  return w;
}

absl::StatusOr<Tensor> WeightLoader::load(std::string_view canonical, const Shape& shape) const {
  absl::StatusOr<Tensor> t =
      ckpt_ ? load_from_checkpoint(canonical, shape) : invent(canonical, shape);
  if (t.ok() && record_ != nullptr) record_->emplace_back(std::string(canonical), *t);
  return t;
}

// Values in the ranges a trained model has, so an untrained model still runs stably: norms near 1
// (or 0 with zero-centred weights), decay parameters in their usual init ranges, projections
// N(0, 0.02)-like.
Tensor WeightLoader::invent(std::string_view canonical, const Shape& shape) const {
  Tensor t = Tensor::empty(shape);
  uint64_t h = seed_ ^ 0x9e3779b97f4a7c15ull;
  for (char c : canonical) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  std::mt19937_64 rng(h);
  const auto ends_with = [&](std::string_view suffix) {
    return canonical.size() >= suffix.size() &&
           canonical.substr(canonical.size() - suffix.size()) == suffix;
  };
  float* p = t.data<float>();
  const int64_t n = t.numel();
  if (ends_with("norm.weight")) {
    std::normal_distribution<float> d(0.0f, 0.02f);
    // Only the decoder's own norms (and GQA's q/k norms) store zero-centred weights when
    // norm_weight_offset is 1; every other norm applies its weight directly.
    const bool offset_norm = ends_with("mixer_norm.weight") || ends_with("ffn_norm.weight") ||
                             canonical == "final_norm.weight" || ends_with("gqa.q_norm.weight") ||
                             ends_with("gqa.k_norm.weight");
    const float base = offset_norm ? 1.0f - cfg_.norm_weight_offset : 1.0f;
    for (int64_t i = 0; i < n; ++i) p[i] = base + d(rng);
  } else if (ends_with("A_log")) {
    std::uniform_real_distribution<float> d(0.0f, 2.7f);  // exp(A_log) in [1, 15]
    for (int64_t i = 0; i < n; ++i) p[i] = d(rng);
  } else if (ends_with("dt_bias") || ends_with("router.bias") || ends_with(".bias")) {
    std::normal_distribution<float> d(0.0f, 0.1f);
    for (int64_t i = 0; i < n; ++i) p[i] = d(rng);
  } else if (ends_with("conv.weight")) {
    std::normal_distribution<float> d(0.0f, 0.3f);
    for (int64_t i = 0; i < n; ++i) p[i] = d(rng);
  } else {
    std::normal_distribution<float> d(0.0f, 0.05f);
    for (int64_t i = 0; i < n; ++i) p[i] = d(rng);
  }
  return t;
}

absl::StatusOr<Tensor> WeightLoader::load_from_checkpoint(std::string_view canonical,
                                                          const Shape& shape) const {
  LOOM_ASSIGN_OR_RETURN(TensorSource src, tensor_source(cfg_, canonical));
  std::vector<Tensor> parts;
  for (const std::string& n : src.names) {
    if (!ckpt_->contains(n))
      return absl::NotFoundError(
          absl::StrCat("checkpoint is missing tensor '", n, "' (for ", absl_sv(canonical), ")"));
    LOOM_ASSIGN_OR_RETURN(Tensor t, ckpt_->get(n));
    if (t.dtype() == DType::kF8E4M3 || t.dtype() == DType::kF8E5M2) {
      // Block-quantized FP8 (DeepSeek-V3): X.weight comes with X.weight_scale_inv.
      const std::string scale_name = n + "_scale_inv";
      if (!ckpt_->contains(scale_name))
        return absl::InvalidArgumentError(
            absl::StrCat("FP8 tensor '", n, "' has no '", scale_name, "' in the checkpoint"));
      LOOM_ASSIGN_OR_RETURN(Tensor scale, ckpt_->get(scale_name));
      LOOM_ASSIGN_OR_RETURN(
          t, dequantize_fp8_blocks(t, scale, cfg_.fp8_block_rows, cfg_.fp8_block_cols, n));
    }
    LOOM_ASSIGN_OR_RETURN(Tensor f, as_f32(t, n));
    parts.push_back(std::move(f));
  }
  if (parts.empty())
    return absl::NotFoundError(absl::StrCat("no checkpoint tensor for ", absl_sv(canonical)));

  // The combined shape, computed from the parts, is checked against `shape` before copying.
  Shape combined = parts[0].shape();
  for (size_t i = 1; i < parts.size(); ++i) {
    if (parts[i].shape() != parts[0].shape() && src.combine == TensorSource::Combine::kStack)
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", src.names[i], "' has shape ", parts[i].shape().to_string(),
                       "; expected ", parts[0].shape().to_string(), " like '", src.names[0],
                       "' (for ", absl_sv(canonical), ")"));
  }
  if (src.combine == TensorSource::Combine::kStack) {
    Shape s;
    s.push_back(static_cast<int64_t>(parts.size()));
    for (int64_t d : combined) s.push_back(d);
    combined = s;
  } else if (src.combine == TensorSource::Combine::kConcat) {
    for (size_t i = 1; i < parts.size(); ++i) {
      const Shape& ps = parts[i].shape();
      bool same_tail = ps.ndim() == combined.ndim() && ps.ndim() >= 1;
      for (int d = 1; same_tail && d < ps.ndim(); ++d) same_tail = ps[d] == combined[d];
      if (!same_tail)
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", src.names[i], "' has shape ", ps.to_string(),
                         ", which cannot be concatenated with '", src.names[0], "' ",
                         parts[0].shape().to_string(), " (for ", absl_sv(canonical), ")"));
      combined[0] += ps[0];
    }
  }
  if (src.transform) {
    // Transforms work on the combined tensor; combine first, then transform, then check.
    Tensor whole = parts.size() == 1 ? parts[0].reshape(combined) : Tensor::empty(combined);
    if (parts.size() > 1) {
      char* dst = static_cast<char*>(whole.raw());
      for (const Tensor& p : parts) {
        std::memcpy(dst, p.raw(), p.nbytes());
        dst += p.nbytes();
      }
    }
    absl::StatusOr<Tensor> t = src.transform(whole);
    if (!t.ok())
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", src.names[0], "' (for ", absl_sv(canonical), "): ", t.status().message()));
    if (squeeze(t->shape()) != squeeze(shape) || t->numel() != shape.numel())
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", src.names[0], "' gives shape ", t->shape().to_string(), " for ",
                       absl_sv(canonical), "; expected ", shape.to_string()));
    return t->reshape(shape);
  }
  if (squeeze(combined) != squeeze(shape) || combined.numel() != shape.numel())
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", src.names[0], (src.names.size() > 1 ? "' (and its siblings)" : "'"),
        " gives shape ", combined.to_string(), " for ", absl_sv(canonical), "; expected ",
        shape.to_string()));

  if (parts.size() == 1) return parts[0].reshape(shape);
  Tensor out = Tensor::empty(shape, DType::kF32);
  char* dst = static_cast<char*>(out.raw());
  for (const Tensor& p : parts) {
    std::memcpy(dst, p.raw(), p.nbytes());
    dst += p.nbytes();
  }
  return out;
}

}  // namespace loom
