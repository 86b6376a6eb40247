#include "engine/model/training_batch.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace loom {

absl::Status require_f32_weights(int layer, std::string_view kind,
                                 std::initializer_list<const Tensor*> weights) {
  for (const Tensor* w : weights)
    if (w->defined() && w->dtype() != DType::kF32)
      return absl::UnimplementedError(
          absl::StrCat("training: layer ", layer, "'s ", absl_sv(kind), " weights must be f32"));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<RowSpan>> training_sequences(const BatchLayout& batch) {
  // The layout's host copies, else the device step data read back: a few integers per sequence.
  const Tensor cu_host =
      batch.host_cu_seqlens.defined() ? batch.host_cu_seqlens : batch.cu_seqlens.to(Device::kCpu);
  const Tensor past_host =
      batch.host_past_lens.defined() ? batch.host_past_lens : batch.past_lens.to(Device::kCpu);
  const int64_t b = batch.cu_seqlens.dim(0) - 1;
  const int64_t* cu = cu_host.data<int64_t>();
  const int64_t* past = past_host.data<int64_t>();
  std::vector<RowSpan> out;
  out.reserve(b);
  for (int64_t s = 0; s < b; ++s) {
    if (past[s] != 0)
      return absl::FailedPreconditionError(
          absl::StrCat("training: sequence ", s, " continues ", past[s],
                       " cached positions; a training sequence starts from a fresh state"));
    out.emplace_back(cu[s], cu[s + 1]);
  }
  return out;
}

}  // namespace loom
