#include "weights/weight_loader.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"
#include "weights/adapters/adapters.h"

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
    case DType::kF32: return t.is_contiguous() ? t : t.clone();
    case DType::kBF16:
    case DType::kF16: return t.to_f32();
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
  absl::StatusOr<TensorSource> src = tensor_source(cfg_, canonical);
  if (!src.ok()) return false;
  for (const std::string& n : src->names)
    if (!ckpt_->contains(n)) return false;
  return !src->names.empty();
}

absl::StatusOr<Tensor> WeightLoader::load(std::string_view canonical, const Shape& shape) const {
  LOOM_ASSIGN_OR_RETURN(TensorSource src, tensor_source(cfg_, canonical));
  std::vector<Tensor> parts;
  for (const std::string& n : src.names) {
    if (!ckpt_->contains(n))
      return absl::NotFoundError(absl::StrCat("checkpoint is missing tensor '", n, "' (for ",
                                              absl_sv(canonical), ")"));
    LOOM_ASSIGN_OR_RETURN(Tensor t, ckpt_->get(n));
    LOOM_ASSIGN_OR_RETURN(Tensor f, as_f32(t, n));
    parts.push_back(std::move(f));
  }
  if (parts.empty())
    return absl::NotFoundError(absl::StrCat("no checkpoint tensor for ", absl_sv(canonical)));

  // The combined shape, computed from the parts, is checked against `shape` before copying.
  Shape combined = parts[0].shape();
  for (size_t i = 1; i < parts.size(); ++i) {
    if (parts[i].shape() != parts[0].shape() && src.combine == TensorSource::Combine::kStack)
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", src.names[i], "' has shape ", parts[i].shape().to_string(), "; expected ",
          parts[0].shape().to_string(), " like '", src.names[0], "' (for ", absl_sv(canonical), ")"));
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
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor '", src.names[i], "' has shape ", ps.to_string(),
            ", which cannot be concatenated with '", src.names[0], "' ", parts[0].shape().to_string(),
            " (for ", absl_sv(canonical), ")"));
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
      return absl::InvalidArgumentError(absl::StrCat("tensor '", src.names[0], "' (for ",
                                                     absl_sv(canonical), "): ", t.status().message()));
    if (squeeze(t->shape()) != squeeze(shape) || t->numel() != shape.numel())
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", src.names[0], "' gives shape ", t->shape().to_string(), " for ",
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
