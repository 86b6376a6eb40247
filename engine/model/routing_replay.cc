#include "engine/model/routing_replay.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace loom {

absl::Status validate_routing_replay(const ModelConfig& cfg, const RoutingReplay& replay,
                                     int64_t rows) {
  if (static_cast<int>(replay.expert_ids.size()) != cfg.num_layers)
    return absl::InvalidArgumentError(absl::StrCat("routing replay: ", replay.expert_ids.size(),
                                                   " layers for a model of ", cfg.num_layers));
  const int64_t k = cfg.moe.top_k, e = cfg.moe.num_experts;
  for (int l = 0; l < cfg.num_layers; ++l) {
    const Tensor& ids = replay.expert_ids[static_cast<size_t>(l)];
    if (!ids.defined()) continue;
    if (cfg.ffns[static_cast<size_t>(l)] != FfnType::kMoe)
      return absl::InvalidArgumentError(
          absl::StrCat("routing replay: experts for layer ", l, ", which has no MoE"));
    if (ids.dtype() != DType::kI32 || !ids.device().is_cpu() || !ids.is_contiguous() ||
        ids.ndim() != 2 || ids.dim(0) != rows || ids.dim(1) != k)
      return absl::InvalidArgumentError(absl::StrCat("routing replay: layer ", l, "'s experts are ",
                                                     ids.describe(), "; expected contiguous i32 [",
                                                     rows, ", ", k, "] on the CPU"));
    const int32_t* p = ids.data<int32_t>();
    for (int64_t t = 0; t < rows; ++t) {
      const int32_t* r = p + t * k;
      if (r[0] < 0) {
        if (r[0] != -1)
          return absl::InvalidArgumentError(absl::StrCat(
              "routing replay: layer ", l, " row ", t, " starts with ", r[0], " (-1: own top-k)"));
        continue;
      }
      for (int64_t j = 0; j < k; ++j) {
        if (r[j] < 0 || r[j] >= e)
          return absl::InvalidArgumentError(absl::StrCat("routing replay: layer ", l, " row ", t,
                                                         " names expert ", r[j], " of ", e));
        if (std::find(r, r + j, r[j]) != r + j)
          return absl::InvalidArgumentError(absl::StrCat("routing replay: layer ", l, " row ", t,
                                                         " names expert ", r[j], " twice"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace loom
