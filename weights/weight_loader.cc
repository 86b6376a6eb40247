#include "weights/weight_loader.h"

#include <algorithm>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "core/fp8_matrix.h"
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

bool is_float_storage(DType d) { return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16; }

absl::Status not_float(const Tensor& t, std::string_view name) {
  return absl::InvalidArgumentError(absl::StrCat("tensor '", absl_sv(name), "' has dtype ",
                                                 absl_sv(dtype_name(t.dtype())),
                                                 "; expected a float type"));
}

// dst = src element by element, converted: same dtype is a copy of the bytes (bf16 stays bf16,
// never through f32); widening to f32 is exact; narrowing to bf16 rounds once, to nearest even.
// Both contiguous host tensors with the same element count; src f32/bf16/f16, dst f32/bf16
// (checked by the callers before they allocate).
void convert_into(const Tensor& src, const Tensor& dst) {
  LOOM_CHECK(src.numel() == dst.numel() && src.is_contiguous() && dst.is_contiguous(),
             "convert_into: %s into %s", src.describe().c_str(), dst.describe().c_str());
  const int64_t n = src.numel();
  if (src.dtype() == dst.dtype()) {
    std::memcpy(dst.raw(), src.raw(), src.nbytes());
    return;
  }
  const auto* in16 = static_cast<const uint16_t*>(src.raw());
  if (dst.dtype() == DType::kF32) {
    float* out = dst.data<float>();
    if (src.dtype() == DType::kBF16) {
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(in16[i]);
      return;
    }
    if (src.dtype() == DType::kF16) {
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(in16[i]);
      return;
    }
  } else if (dst.dtype() == DType::kBF16) {
    uint16_t* out = dst.data<uint16_t>();
    if (src.dtype() == DType::kF32) {
      const float* in = src.data<float>();
      for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(in[i]);
      return;
    }
    if (src.dtype() == DType::kF16) {
      for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(f16_to_f32(in16[i]));
      return;
    }
  }
  LOOM_CHECK(false, "convert_into: %s into %s", src.describe().c_str(), dst.describe().c_str());
}

bool has_moe_layers(const ModelConfig& cfg) {
  return std::find(cfg.ffns.begin(), cfg.ffns.end(), FfnType::kMoe) != cfg.ffns.end();
}

ExpertRange all_rows(const Shape& shape) { return {0, shape.ndim() > 0 ? shape[0] : 0}; }

}  // namespace

void copy_expert_rows(const Tensor& src, int64_t src_row, const Tensor& dst, int64_t dst_row,
                      int64_t n) {
  bool same_rows = src.dtype() == dst.dtype() && src.ndim() == dst.ndim() && src.ndim() >= 1 &&
                   src.is_contiguous() && dst.is_contiguous();
  for (int d = 1; same_rows && d < src.ndim(); ++d) same_rows = src.dim(d) == dst.dim(d);
  LOOM_CHECK(same_rows && n >= 0 && src_row >= 0 && src_row + n <= src.dim(0) && dst_row >= 0 &&
                 dst_row + n <= dst.dim(0),
             "copy_expert_rows: rows [%d, +%d) of %s into row %d of %s", src_row, n, src.describe(),
             dst_row, dst.describe());
  if (n == 0) return;
  dst.slice(0, dst_row, dst_row + n).copy_from(src.slice(0, src_row, src_row + n));
  if (src.dtype() == DType::kF8E4M3) {
    // Each expert's scale grid is a row of dimension 0 of the grid too.
    fp8_matrix_scales(dst)
        .slice(0, dst_row, dst_row + n)
        .copy_from(fp8_matrix_scales(src).slice(0, src_row, src_row + n));
  }
}

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

WeightLoader WeightLoader::generated(const ModelConfig& cfg, Generator generate) {
  WeightLoader w(nullptr, cfg);
  w.generate_ = std::move(generate);
  return w;
}

DType WeightLoader::natural_matrix_dtype() const {
  if (!ckpt_) return DType::kF32;
  bool any_bf16 = false;
  for (const std::string& name : ckpt_->names()) {
    const SafetensorsFile::Entry* e = ckpt_->find(name);
    if (e == nullptr || e->shape.ndim() < 2) continue;
    switch (e->dtype) {
      case DType::kBF16:
        any_bf16 = true;
        break;
      case DType::kF32:
      case DType::kF16:
      case DType::kF8E4M3:
      case DType::kF8E5M2:
        return DType::kF32;  // bf16 storage would round these
      default:
        break;  // integer tensors are not weights
    }
  }
  return any_bf16 ? DType::kBF16 : DType::kF32;
}

absl::StatusOr<WeightLoader> WeightLoader::placed(ParameterArena& arena,
                                                  const Placement& placement) const {
  if (arena.device() != placement.device)
    return absl::InvalidArgumentError(
        absl::StrCat("the parameter arena is on ", device_name(arena.device()),
                     " but the placement on ", device_name(placement.device)));
  if (arena.frozen())
    return absl::InvalidArgumentError("the parameter arena is frozen (its load has ended)");
  if (placement.experts) {
    const ExpertRange r = *placement.experts;
    const int64_t e = cfg_.moe.num_experts;
    if (!has_moe_layers(cfg_) || e <= 0)
      return absl::InvalidArgumentError(absl::StrCat("placement expert range [", r.begin, ", ",
                                                     r.end, "): the model has no routed experts"));
    if (r.begin < 0 || r.end > e || r.begin >= r.end)
      return absl::InvalidArgumentError(
          absl::StrCat("placement expert range [", r.begin, ", ", r.end,
                       ") is not a non-empty range of the model's ", e, " experts"));
  }
  if (!placement.expert_slots.empty()) {
    const int64_t e = cfg_.moe.num_experts;
    if (placement.experts)
      return absl::InvalidArgumentError(
          "a placement gives either an expert range or expert slots, not both");
    if (!has_moe_layers(cfg_) || e <= 0)
      return absl::InvalidArgumentError("placement expert slots: the model has no routed experts");
    for (const int32_t x : placement.expert_slots)
      if (x < 0 || x >= e)
        return absl::InvalidArgumentError(absl::StrCat("placement expert slot of expert ", x,
                                                       ": the model has experts [0, ", e, ")"));
    if (placement.trainable)
      return absl::InvalidArgumentError(
          "a trainable model holds every expert once: expert slots (redundant copies moved by "
          "re-placement) are for serving");
  }
  if (placement.dtype == WeightDType::kFP8 && placement.trainable)
    return absl::InvalidArgumentError(
        "a trainable model keeps f32 master weights: load it with f32 (or auto) matrices, not "
        "fp8");
  WeightLoader w = *this;
  w.arena_ = &arena;
  w.placement_ = placement;
  w.fp8_keeps_others_ = false;
  w.fp8_others_bf16_ = false;
  if (placement.dtype == WeightDType::kAuto) {
    // On a GPU, f32 activations ask for the f32 path (every matrix dequantized, the fixtures' f32
    // bounds); any other activations compute against bf16 or FP8 matrices (parameter_arena.h).
    const bool gpu_reduced =
        !placement.device.is_cpu() && placement.activations != ActivationDType::kF32;
    if (!placement.trainable && holds_fp8_matrices() &&
        (placement.device.is_cpu() || gpu_reduced)) {
      w.placement_.dtype = WeightDType::kFP8;
      w.fp8_keeps_others_ = true;
      // bf16 activations reach no f32 matrix on a GPU (the GEMMs pair bf16 x with bf16 or FP8 w).
      w.fp8_others_bf16_ = gpu_reduced;
    } else if (gpu_reduced && placement.activations == ActivationDType::kBF16) {
      w.placement_.dtype = WeightDType::kBF16;
    } else {
      w.placement_.dtype =
          natural_matrix_dtype() == DType::kBF16 ? WeightDType::kBF16 : WeightDType::kF32;
    }
  }
  return w;
}

bool WeightLoader::holds_fp8_matrices() const {
  if (!ckpt_ || cfg_.fp8_block_rows != kFp8BlockSize || cfg_.fp8_block_cols != kFp8BlockSize)
    return false;
  for (const std::string& name : ckpt_->names()) {
    const SafetensorsFile::Entry* e = ckpt_->find(name);
    if (e != nullptr && e->dtype == DType::kF8E4M3 && e->shape.ndim() >= 2) return true;
  }
  return false;
}

absl::StatusOr<Tensor> WeightLoader::copy_stored_fp8(std::string_view canonical, const Shape& shape,
                                                     ExpertRange rows) const {
  if (cfg_.fp8_block_rows != kFp8BlockSize || cfg_.fp8_block_cols != kFp8BlockSize) return Tensor();
  absl::StatusOr<TensorSource> src = tensor_source(cfg_, canonical);
  if (!src.ok() || src->names.empty() || src->transform || shape.ndim() < 2) return Tensor();
  // The parts read: a stack's rows only (the other experts need not be present).
  std::vector<std::string> read = src->names;
  if (src->combine == TensorSource::Combine::kStack &&
      static_cast<int64_t>(read.size()) == shape[0])
    read.assign(src->names.begin() + rows.begin, src->names.begin() + rows.end);
  for (const std::string& n : read) {
    const SafetensorsFile::Entry* e = ckpt_->find(n);
    if (e == nullptr || e->dtype != DType::kF8E4M3 || !ckpt_->contains(n + "_scale_inv"))
      return Tensor();  // not (all) FP8: quantized from the f32 values, or an error there
  }
  const bool whole = rows == all_rows(shape);
  // The parts in output order: their values and scale grids, back to back, are the matrix's.
  struct Part {
    Tensor q, scale;
  };
  std::vector<Part> parts;
  auto part = [&](const std::string& n, const Shape& want, ExpertRange take) -> absl::Status {
    LOOM_ASSIGN_OR_RETURN(Tensor q, ckpt_->get(n));
    LOOM_ASSIGN_OR_RETURN(Tensor scale, ckpt_->get(n + "_scale_inv"));
    if (q.shape() != want || scale.shape() != fp8_scale_shape(want))
      return absl::InvalidArgumentError(absl::StrCat(
          "FP8 tensor '", n, "' ", q.shape().to_string(), " with '", n, "_scale_inv' ",
          scale.shape().to_string(), " (for ", absl_sv(canonical), "): expected ", want.to_string(),
          " with ", fp8_scale_shape(want).to_string(), " (128 x 128 blocks)"));
    if (scale.dtype() != DType::kF32) {
      if (scale.dtype() != DType::kBF16 && scale.dtype() != DType::kF16)
        return absl::InvalidArgumentError(
            absl::StrCat("'", n, "_scale_inv' has dtype ", absl_sv(dtype_name(scale.dtype()))));
      scale = scale.to_f32();  // exact
    }
    if (take != all_rows(want)) {
      q = q.slice(0, take.begin, take.end);
      scale = scale.slice(0, take.begin, take.end);
    }
    parts.push_back({q, scale});
    return absl::OkStatus();
  };
  Shape tail;  // shape[1:]
  for (int d = 1; d < shape.ndim(); ++d) tail.push_back(shape[d]);
  switch (src->combine) {
    case TensorSource::Combine::kStack:
      if (static_cast<int64_t>(src->names.size()) != shape[0]) return Tensor();
      for (int64_t e = rows.begin; e < rows.end; ++e)
        LOOM_RETURN_IF_ERROR(part(src->names[e], tail, all_rows(tail)));
      break;
    case TensorSource::Combine::kConcat: {
      // Rows of parts concatenated: their scale grids concatenate when every part but the last
      // ends on a block boundary.
      if (!whole || shape.ndim() != 2) return Tensor();
      int64_t total = 0;
      for (size_t i = 0; i < src->names.size(); ++i) {
        const Shape& ps = ckpt_->find(src->names[i])->shape;
        if (ps.ndim() != 2 || ps[1] != shape[1]) return Tensor();
        if (i + 1 < src->names.size() && ps[0] % kFp8BlockSize != 0) return Tensor();
        total += ps[0];
      }
      if (total != shape[0]) return Tensor();
      for (const std::string& n : src->names)
        LOOM_RETURN_IF_ERROR(part(n, ckpt_->find(n)->shape, all_rows(ckpt_->find(n)->shape)));
      break;
    }
    case TensorSource::Combine::kSingle:
      if (src->names.size() != 1) return Tensor();
      if (ckpt_->find(src->names[0])->shape != shape) return Tensor();
      LOOM_RETURN_IF_ERROR(part(src->names[0], shape, rows));
      break;
  }
  Shape out = shape;
  if (!whole) out[0] = rows.count();
  Tensor dst = fp8_host_destination(canonical, out);
  const Tensor scales = fp8_matrix_scales(dst);
  auto* q = static_cast<char*>(dst.raw());
  auto* s = static_cast<char*>(scales.raw());
  for (const Part& p : parts) {
    const Tensor pq = p.q.is_contiguous() ? p.q : p.q.clone();
    const Tensor ps = p.scale.is_contiguous() ? p.scale : p.scale.clone();
    std::memcpy(q, pq.raw(), pq.nbytes());
    std::memcpy(s, ps.raw(), ps.nbytes());
    q += pq.nbytes();
    s += ps.nbytes();
  }
  LOOM_CHECK(q == static_cast<char*>(dst.raw()) + dst.nbytes() &&
                 s == static_cast<char*>(scales.raw()) + scales.nbytes(),
             "copy_stored_fp8: parts of %s do not fill %s", std::string(canonical).c_str(),
             dst.describe().c_str());
  return dst;
}

absl::StatusOr<Tensor> WeightLoader::load_fp8(std::string_view canonical, const Shape& shape,
                                              ExpertRange rows) const {
  Tensor dst;
  if (ckpt_) {
    LOOM_ASSIGN_OR_RETURN(dst, copy_stored_fp8(canonical, shape, rows));
  }
  if (!dst.defined()) {
    if (fp8_keeps_others_) {
      // kAuto over an FP8 checkpoint: a matrix not stored in FP8 (DeepSeek-V3's lm_head) keeps
      // its precision, as kAuto does for any checkpoint.
      bool bf16 = ckpt_ != nullptr || fp8_others_bf16_;
      absl::StatusOr<TensorSource> src = tensor_source(cfg_, canonical);
      if (src.ok()) {
        const bool stack_rows = src->combine == TensorSource::Combine::kStack &&
                                static_cast<int64_t>(src->names.size()) == shape[0];
        for (size_t i = 0; i < src->names.size(); ++i) {
          // A stack's rows not read need not be present (expert parallelism).
          if (stack_rows && !rows.contains(static_cast<int64_t>(i))) continue;
          const SafetensorsFile::Entry* e = ckpt_ ? ckpt_->find(src->names[i]) : nullptr;
          bf16 &= fp8_others_bf16_ || (e != nullptr && e->dtype == DType::kBF16);
        }
      }
      return load_as(canonical, shape, bf16 ? DType::kBF16 : DType::kF32, rows);
    }
    // Everything else is quantized from its f32 values, read by an unplaced copy of this loader.
    WeightLoader plain = *this;
    plain.arena_ = nullptr;
    plain.record_ = nullptr;
    plain.placement_ = Placement{};
    LOOM_ASSIGN_OR_RETURN(Tensor w, plain.load_as(canonical, shape, DType::kF32, rows));
    if (!w.is_contiguous()) w = w.clone();
    dst = fp8_host_destination(canonical, w.shape());
    LOOM_RETURN_IF_ERROR(quantize_fp8_blocks(w, dst, canonical));
  }
  if (arena_ != nullptr && !arena_->device().is_cpu()) {
    // Built on the host, then uploaded once: the values and the scale grid (the trailer is
    // written by allocate_fp8).
    const Tensor dev = arena_->allocate_fp8(canonical, dst.shape());
    dev.copy_from(dst);
    fp8_matrix_scales(dev).copy_from(fp8_matrix_scales(dst));
    dst = dev;
  }
  if (record_ != nullptr) record_->emplace_back(std::string(canonical), dst);
  return dst;
}

Tensor WeightLoader::fp8_host_destination(std::string_view canonical, const Shape& shape) const {
  return arena_ != nullptr && arena_->device().is_cpu() ? arena_->allocate_fp8(canonical, shape)
                                                        : fp8_matrix_empty(shape);
}

Tensor WeightLoader::destination(std::string_view canonical, const Shape& shape,
                                 DType dtype) const {
  // A device arena gets the finished tensor in one upload (load_as); conversions run on the host.
  return arena_ != nullptr && arena_->device().is_cpu() ? arena_->allocate(canonical, shape, dtype)
                                                        : Tensor::empty(shape, dtype);
}

absl::StatusOr<Tensor> WeightLoader::load(std::string_view canonical, const Shape& shape) const {
  return load_as(canonical, shape, DType::kF32, all_rows(shape));
}

absl::StatusOr<Tensor> WeightLoader::load_matrix(std::string_view canonical,
                                                 const Shape& shape) const {
  return load_as(canonical, shape, placement_.matrix_dtype(), all_rows(shape));
}

absl::StatusOr<Tensor> WeightLoader::load_experts(std::string_view canonical,
                                                  const Shape& shape) const {
  if (shape.ndim() < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("experts '", absl_sv(canonical), "' need a leading expert dimension"));
  if (!placement_.expert_slots.empty()) return load_expert_slots(canonical, shape);
  const ExpertRange own = placement_.owned_experts(shape[0]);
  if (own.begin < 0 || own.end > shape[0] || own.begin >= own.end)
    return absl::InvalidArgumentError(absl::StrCat("experts [", own.begin, ", ", own.end, ") of '",
                                                   absl_sv(canonical), "' with ", shape[0],
                                                   " experts"));
  return load_as(canonical, shape, placement_.matrix_dtype(), own);
}

absl::StatusOr<Tensor> WeightLoader::load_expert_slots(std::string_view canonical,
                                                       const Shape& shape) const {
  if (record_ != nullptr)
    return absl::InvalidArgumentError(
        "a slot placement's expert weights are not the checkpoint's tensors: record (export) a "
        "model loaded with every expert");
  const std::vector<int32_t>& slots = placement_.expert_slots;
  const int64_t count = static_cast<int64_t>(slots.size());
  // Each run of consecutive experts in consecutive slots is one load of those rows by an unplaced
  // copy of this loader (the same dtype decisions, host memory, only those experts' bytes read),
  // then copied into its slots: at most one run is staged at a time.
  WeightLoader staging = *this;
  staging.arena_ = nullptr;
  staging.record_ = nullptr;
  Tensor dst;
  for (int64_t s = 0; s < count;) {
    int64_t n = 1;
    while (s + n < count && slots[s + n] == slots[s] + n) ++n;
    const ExpertRange run{slots[s], slots[s] + n};
    absl::StatusOr<Tensor> part = staging.load_as(canonical, shape, placement_.matrix_dtype(), run);
    if (!part.ok())
      return absl::Status(
          part.status().code(),
          absl::StrCat(part.status().message(),
                       n == 1 ? absl::StrCat(" (this rank's expert slot ", s, " holds expert ",
                                             run.begin, ")")
                              : absl::StrCat(" (this rank's expert slots ", s, "..", s + n - 1,
                                             " hold experts ", run.begin, "..", run.end - 1, ")")));
    if (!dst.defined()) {
      Shape out = part->shape();
      out[0] = count;
      // Writable: a re-placement rewrites slots (parameter_arena.h).
      dst = part->dtype() == DType::kF8E4M3
                ? arena_->allocate_fp8(canonical, out, /*stays_writable=*/true)
                : arena_->allocate(canonical, out, part->dtype(), /*stays_writable=*/true);
    }
    if (part->dtype() != dst.dtype() || part->dim(0) != n)
      return absl::InternalError(absl::StrCat("experts ", run.begin, "..", run.end - 1, " of '",
                                              absl_sv(canonical), "' loaded as ", part->describe(),
                                              ", the slots are ", dst.describe()));
    copy_expert_rows(*part, 0, dst, s, n);
    s += n;
  }
  return dst;
}

absl::StatusOr<Tensor> WeightLoader::load_as(std::string_view canonical, const Shape& shape,
                                             DType dtype, ExpertRange rows) const {
  if (dtype == DType::kF8E4M3) return load_fp8(canonical, shape, rows);
  absl::StatusOr<Tensor> t;
  if (generate_) {
    Shape out = shape;
    if (rows != all_rows(shape)) out[0] = rows.count();
    // Straight into the arena, on its device: a generated model is never staged on the host.
    const Tensor dst =
        arena_ != nullptr ? arena_->allocate(canonical, out, dtype) : Tensor::empty(out, dtype);
    LOOM_RETURN_IF_ERROR(generate_(canonical, shape, rows, dst));
    if (record_ != nullptr) record_->emplace_back(std::string(canonical), dst);
    return dst;
  }
  if (ckpt_) {
    t = load_from_checkpoint(canonical, shape, dtype, rows);
  } else {
    Tensor full = invent(canonical, shape);
    if (arena_ == nullptr && dtype == DType::kF32 && rows == all_rows(shape)) {
      t = full;
    } else {
      const Tensor part = rows == all_rows(shape) ? full : full.slice(0, rows.begin, rows.end);
      Tensor dst = destination(canonical, part.shape(), dtype);
      convert_into(part, dst);
      t = dst;
    }
  }
  if (t.ok() && arena_ != nullptr && !arena_->device().is_cpu()) {
    // Converted on the host, then uploaded once into the device arena.
    const Tensor dev = arena_->allocate(canonical, t->shape(), t->dtype());
    dev.copy_from(t->is_contiguous() ? *t : t->clone());
    t = dev;
  }
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
                                                          const Shape& shape, DType dtype,
                                                          ExpertRange rows) const {
  LOOM_ASSIGN_OR_RETURN(TensorSource src, tensor_source(cfg_, canonical));
  if (src.names.empty())
    return absl::NotFoundError(absl::StrCat("no checkpoint tensor for ", absl_sv(canonical)));
  const bool whole = rows == all_rows(shape);
  // A stack of per-expert tensors is read only for the rows (experts) asked for.
  const bool stacked_rows =
      !whole && src.combine == TensorSource::Combine::kStack && !src.transform && shape.ndim() >= 1;
  if (stacked_rows && static_cast<int64_t>(src.names.size()) != shape[0])
    return absl::InvalidArgumentError(
        absl::StrCat("'", src.names[0], "' and its siblings stack ", src.names.size(),
                     " tensors for ", absl_sv(canonical), "; expected ", shape.to_string()));
  const size_t first = stacked_rows ? static_cast<size_t>(rows.begin) : 0;
  const size_t last = stacked_rows ? static_cast<size_t>(rows.end) : src.names.size();
  // Only the parts read must be present: an expert-parallel rank loading its experts of a stack
  // does not need the other experts' tensors (shards it was not given).
  for (size_t i = first; i < last; ++i) {
    if (!ckpt_->contains(src.names[i]))
      return absl::NotFoundError(absl::StrCat(
          "checkpoint is missing tensor '", src.names[i], "' (for ", absl_sv(canonical),
          stacked_rows ? absl::StrCat(", expert ", i, ", which this load needs") : "", ")"));
  }
  // Shapes come from the headers, so that parts present but not read are checked too (a stack's
  // absent parts take the first read part's shape).
  std::vector<Shape> shapes;
  for (const std::string& n : src.names) {
    const SafetensorsFile::Entry* e = ckpt_->find(n);
    shapes.push_back(e != nullptr ? e->shape : ckpt_->find(src.names[first])->shape);
  }
  std::vector<Tensor> parts;
  for (size_t i = first; i < last; ++i) {
    const std::string& n = src.names[i];
    LOOM_ASSIGN_OR_RETURN(Tensor t, ckpt_->get(n));
    if (t.dtype() == DType::kF8E4M3 || t.dtype() == DType::kF8E5M2) {
      // Block-quantized FP8 (DeepSeek-V3): X.weight comes with X.weight_scale_inv. Dequantized to
      // f32 products; a bf16 placement rounds each product once.
      const std::string scale_name = n + "_scale_inv";
      if (!ckpt_->contains(scale_name))
        return absl::InvalidArgumentError(
            absl::StrCat("FP8 tensor '", n, "' has no '", scale_name, "' in the checkpoint"));
      LOOM_ASSIGN_OR_RETURN(Tensor scale, ckpt_->get(scale_name));
      LOOM_ASSIGN_OR_RETURN(
          t, dequantize_fp8_blocks(t, scale, cfg_.fp8_block_rows, cfg_.fp8_block_cols, n));
    }
    if (!is_float_storage(t.dtype())) return not_float(t, n);
    if (!t.is_contiguous()) t = t.clone();
    parts.push_back(std::move(t));
  }

  // The combined shape, computed from the parts, is checked against `shape` before copying.
  Shape combined = shapes[0];
  for (size_t i = 1; i < shapes.size(); ++i) {
    if (shapes[i] != shapes[0] && src.combine == TensorSource::Combine::kStack)
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", src.names[i], "' has shape ", shapes[i].to_string(), "; expected ",
          shapes[0].to_string(), " like '", src.names[0], "' (for ", absl_sv(canonical), ")"));
  }
  if (src.combine == TensorSource::Combine::kStack) {
    Shape s;
    s.push_back(static_cast<int64_t>(shapes.size()));
    for (int64_t d : combined) s.push_back(d);
    combined = s;
  } else if (src.combine == TensorSource::Combine::kConcat) {
    for (size_t i = 1; i < shapes.size(); ++i) {
      const Shape& ps = shapes[i];
      bool same_tail = ps.ndim() == combined.ndim() && ps.ndim() >= 1;
      for (int d = 1; same_tail && d < ps.ndim(); ++d) same_tail = ps[d] == combined[d];
      if (!same_tail)
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", src.names[i], "' has shape ", ps.to_string(),
                         ", which cannot be concatenated with '", src.names[0], "' ",
                         shapes[0].to_string(), " (for ", absl_sv(canonical), ")"));
      combined[0] += ps[0];
    }
  }

  // Parts of one dtype are combined in it (bf16 stays bf16); mixed ones in f32.
  DType part_dtype = parts[0].dtype();
  for (const Tensor& p : parts)
    if (p.dtype() != part_dtype) part_dtype = DType::kF32;
  // The parts back to back, converted to `to`, into the contiguous `dst`.
  auto concat_into = [&](const Tensor& dst) {
    const Tensor flat = dst.reshape({dst.numel()});
    int64_t off = 0;
    for (const Tensor& p : parts) {
      convert_into(p, flat.slice(0, off, off + p.numel()));
      off += p.numel();
    }
  };
  Shape out_shape = shape;
  if (!whole) out_shape[0] = rows.count();

  if (src.transform) {
    // Transforms work on the combined tensor; combine first, then transform, then check.
    Tensor all = parts.size() == 1 && parts[0].dtype() == part_dtype
                     ? parts[0].reshape(combined)
                     : Tensor::empty(combined, part_dtype);
    if (parts.size() > 1 || parts[0].dtype() != part_dtype) concat_into(all);
    absl::StatusOr<Tensor> t = src.transform(all);
    if (!t.ok())
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", src.names[0], "' (for ", absl_sv(canonical), "): ", t.status().message()));
    if (squeeze(t->shape()) != squeeze(shape) || t->numel() != shape.numel())
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", src.names[0], "' gives shape ", t->shape().to_string(), " for ",
                       absl_sv(canonical), "; expected ", shape.to_string()));
    Tensor full = t->is_contiguous() ? t->reshape(shape) : t->clone().reshape(shape);
    if (arena_ == nullptr && whole && full.dtype() == dtype) return full;
    const Tensor part = whole ? full : full.slice(0, rows.begin, rows.end);
    Tensor dst = destination(canonical, out_shape, dtype);
    convert_into(part, dst);
    return dst;
  }
  if (squeeze(combined) != squeeze(shape) || combined.numel() != shape.numel())
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", src.names[0], (src.names.size() > 1 ? "' (and its siblings)" : "'"),
        " gives shape ", combined.to_string(), " for ", absl_sv(canonical), "; expected ",
        shape.to_string()));

  // Unplaced loads keep single tensors of the asked dtype as views of the mapped file.
  if (arena_ == nullptr && whole && parts.size() == 1 && parts[0].dtype() == dtype)
    return parts[0].reshape(shape);
  if (whole || stacked_rows) {
    Tensor dst = destination(canonical, out_shape, dtype);
    concat_into(dst);
    return dst;
  }
  // Rows of a single or concatenated tensor (a stacked expert tensor of a native checkpoint):
  // only those rows are copied.
  Tensor full = parts.size() == 1 ? parts[0].reshape(shape) : Tensor::empty(shape, part_dtype);
  if (parts.size() > 1) concat_into(full);
  Tensor dst = destination(canonical, out_shape, dtype);
  convert_into(full.slice(0, rows.begin, rows.end), dst);
  return dst;
}

}  // namespace loom
