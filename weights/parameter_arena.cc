#include "weights/parameter_arena.h"

#include <sys/mman.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/allocator.h"
#include "core/fp8_matrix.h"
#include "core/status.h"

namespace loom {

absl::StatusOr<WeightDType> parse_weight_dtype(std::string_view name) {
  if (name == "auto") return WeightDType::kAuto;
  if (name == "f32") return WeightDType::kF32;
  if (name == "bf16") return WeightDType::kBF16;
  if (name == "fp8") return WeightDType::kFP8;
  return absl::InvalidArgumentError(absl::StrCat(
      "weight dtype '", absl_sv(name), "' is not supported; expected auto, f32, bf16 or fp8"));
}

std::string_view weight_dtype_name(WeightDType dtype) {
  switch (dtype) {
    case WeightDType::kAuto:
      return "auto";
    case WeightDType::kF32:
      return "f32";
    case WeightDType::kBF16:
      return "bf16";
    case WeightDType::kFP8:
      return "fp8";
  }
  return "?";
}

absl::StatusOr<ActivationDType> parse_activation_dtype(std::string_view name) {
  if (name == "auto") return ActivationDType::kAuto;
  if (name == "f32") return ActivationDType::kF32;
  if (name == "bf16") return ActivationDType::kBF16;
  return absl::InvalidArgumentError(absl::StrCat("activation dtype '", absl_sv(name),
                                                 "' is not supported; expected auto, f32 or bf16"));
}

std::string_view activation_dtype_name(ActivationDType dtype) {
  switch (dtype) {
    case ActivationDType::kAuto:
      return "auto";
    case ActivationDType::kF32:
      return "f32";
    case ActivationDType::kBF16:
      return "bf16";
  }
  return "?";
}

std::string Placement::describe() const {
  return absl::StrCat(device_name(device), ", ", absl_sv(weight_dtype_name(dtype)), " matrices, ",
                      absl_sv(activation_dtype_name(activations)), " activations, ",
                      !expert_slots.empty()
                          ? absl::StrCat("expert slots ", absl::StrJoin(expert_slots, " "))
                      : experts ? absl::StrCat("experts [", experts->begin, ", ", experts->end, ")")
                                : std::string("all experts"));
}

ParameterArena::ParameterArena(Device device, size_t chunk_bytes)
    : device_(device), chunk_bytes_(std::max<size_t>(chunk_bytes, kAlignment)) {}

ParameterArena::~ParameterArena() = default;

std::shared_ptr<void> ParameterArena::allocate_chunk(size_t bytes) {
  if (!device_.is_cpu()) return allocate_buffer(bytes, device_);
  // Host chunks are whole pages of their own (mmap), so that freeze() can make them read-only
  // without touching memory the allocator shares with anything else. Pages are committed when
  // first written, so an unused tail costs address space only.
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  LOOM_CHECK(p != MAP_FAILED, "parameter arena: mapping %zu bytes failed", bytes);
  return std::shared_ptr<void>(p, [bytes](void* q) { munmap(q, bytes); });
}

Tensor ParameterArena::allocate(std::string_view name, const Shape& shape, DType dtype,
                                bool stays_writable) {
  return carve(name, shape, dtype, static_cast<size_t>(shape.numel()) * dtype_size(dtype),
               stays_writable);
}

Tensor ParameterArena::allocate_fp8(std::string_view name, const Shape& shape,
                                    bool stays_writable) {
  Tensor t = carve(name, shape, DType::kF8E4M3, fp8_storage_bytes(shape), stays_writable);
  if (device_.is_cpu()) {
    fp8_write_trailer(t.raw(), shape.numel());
  } else {
    // The trailer goes up once (a device pointer is never dereferenced on the host).
    uint64_t trailer[2] = {fp8_detail::kMagic, static_cast<uint64_t>(shape.numel())};
    const Tensor src = Tensor::wrap(trailer, {16}, DType::kU8);
    Tensor::wrap(static_cast<char*>(t.raw()) + fp8_detail::trailer_offset(shape.numel()), {16},
                 DType::kU8, device_)
        .copy_from(src);
  }
  return t;
}

Tensor ParameterArena::carve(std::string_view name, const Shape& shape, DType dtype, size_t n,
                             bool writable) {
  LOOM_CHECK(!frozen_, "parameter arena: '%s' allocated after freeze(); parameters are immutable",
             std::string(name).c_str());
  LOOM_CHECK(find(name) == nullptr, "parameter arena: '%s' allocated twice",
             std::string(name).c_str());
  const size_t need = std::max<size_t>((n + kAlignment - 1) / kAlignment * kAlignment, kAlignment);
  const int kind = writable ? 1 : 0;
  if (current_[kind] < 0 || chunks_[current_[kind]].size - used_[kind] < need) {
    const size_t size = std::max(chunk_bytes_, need);
    chunks_.push_back({allocate_chunk(size), size, writable});
    reserved_ += size;
    current_[kind] = static_cast<int64_t>(chunks_.size()) - 1;
    used_[kind] = 0;
  }
  const Chunk& chunk = chunks_[current_[kind]];
  void* p = static_cast<char*>(chunk.memory.get()) + used_[kind];
  used_[kind] += need;
  bytes_ += n;
  Tensor t = Tensor::wrap(p, shape, dtype, device_, chunk.memory);
  index_.emplace(std::string(name), entries_.size());
  entries_.push_back({std::string(name), t});
  return t;
}

void ParameterArena::freeze(bool read_only) {
  if (frozen_) return;
  frozen_ = true;
  if (!read_only || !device_.is_cpu()) return;
  for (const Chunk& c : chunks_) {
    if (c.writable) continue;
    LOOM_CHECK(mprotect(c.memory.get(), c.size, PROT_READ) == 0,
               "parameter arena: mprotect of %zu bytes failed", c.size);
  }
}

size_t ParameterArena::bytes(DType dtype) const {
  size_t total = 0;
  for (const Entry& e : entries_)
    if (e.tensor.dtype() == dtype) {
      // A stored FP8 matrix's scales share its allocation (core/fp8_matrix.h).
      total += dtype == DType::kF8E4M3 ? fp8_storage_bytes(e.tensor.shape()) : e.tensor.nbytes();
    }
  return total;
}

const Tensor* ParameterArena::find(std::string_view name) const {
  const auto it = index_.find(absl_sv(name));
  return it == index_.end() ? nullptr : &entries_[it->second].tensor;
}

}  // namespace loom
