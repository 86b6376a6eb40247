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
  if (!batch.cu_seqlens.device().is_cpu())
    return absl::UnimplementedError("training: the backward runs on the CPU for now");
  const int64_t b = batch.cu_seqlens.dim(0) - 1;
  const int64_t* cu = batch.cu_seqlens.data<int64_t>();
  const int64_t* past = batch.past_lens.data<int64_t>();
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
