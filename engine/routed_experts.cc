#include "engine/routed_experts.h"

#include "core/status.h"

namespace loom {

RoutedExpertsRecorder::RoutedExpertsRecorder(const ModelConfig& cfg) : top_k_(cfg.moe.top_k) {
  for (int l = 0; l < cfg.num_layers; ++l)
    if (cfg.ffns[static_cast<size_t>(l)] == FfnType::kMoe) moe_layers_.push_back(l);
}

void RoutedExpertsRecorder::prepare(const ActivationTape& tape) {
  step_ids_.clear();
  for (int l : moe_layers_) {
    const Tensor* ids = tape.find(l, "expert_ids");
    LOOM_CHECK(ids != nullptr, "routing record: MoE layer %d recorded no expert ids", l);
    step_ids_.push_back(ids->device().is_cpu() ? *ids : ids->to(Device::kCpu));
  }
}

void RoutedExpertsRecorder::append(int64_t row, int64_t rows, int64_t first_position,
                                   std::vector<RoutedExperts>& out) const {
  if (rows <= 0) return;
  if (out.empty() || out.back().first_position + out.back().rows != first_position) {
    out.push_back({.first_position = first_position});
  }
  RoutedExperts& run = out.back();
  const int64_t layers = static_cast<int64_t>(moe_layers_.size());
  run.expert_ids.reserve(run.expert_ids.size() + static_cast<size_t>(rows * layers * top_k_));
  for (int64_t r = row; r < row + rows; ++r)
    for (const Tensor& ids : step_ids_) {
      LOOM_CHECK(r < ids.dim(0), "routing record: row %d of a step of %d", r, ids.dim(0));
      const int32_t* p = ids.data<int32_t>() + r * top_k_;
      run.expert_ids.insert(run.expert_ids.end(), p, p + top_k_);
    }
  run.rows += rows;
}

}  // namespace loom
