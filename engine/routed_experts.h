// The engine's routing record (Request::return_routed_experts, routing replay for MoE RL): the
// experts each MoE layer routed a step's rows to, cut into each requesting sequence's positions.
// A step records only when a planned request asked for it, so the serving path pays nothing
// otherwise.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/model/activation_tape.h"
#include "engine/request.h"
#include "weights/model_config.h"

namespace loom {

class RoutedExpertsRecorder {
 public:
  explicit RoutedExpertsRecorder(const ModelConfig& cfg);

  // A tape that keeps only the MoE layers' expert ids, for ModelRunner::run.
  ActivationTape make_tape() const { return ActivationTape({"expert_ids"}); }

  // Appends rows [row, row + rows) of the step recorded on `tape` (downloaded to the host once
  // per step by prepare()) as positions [first_position, ...) to `out`, extending its last run
  // when the positions continue it.
  void append(int64_t row, int64_t rows, int64_t first_position,
              std::vector<RoutedExperts>& out) const;

  // Reads the step's expert ids off `tape` (on the host); call after the forward, before append.
  void prepare(const ActivationTape& tape);

 private:
  std::vector<int> moe_layers_;  // the model's MoE layers, in order
  int64_t top_k_ = 0;
  std::vector<Tensor> step_ids_;  // per MoE layer: [N, top_k] i32 on the host, this step's
};

}  // namespace loom
