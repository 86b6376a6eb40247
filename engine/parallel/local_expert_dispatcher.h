// The dispatcher of a single rank that holds every expert: dispatch is a permutation of the
// slots by expert, combine its inverse with the weighted sum. No communication.
#pragma once

#include "engine/parallel/expert_dispatcher.h"

namespace loom {

class LocalExpertDispatcher final : public ExpertDispatcher {
 public:
  explicit LocalExpertDispatcher(int64_t num_experts);

  ExpertRange owned() const override { return {0, num_experts_}; }
  Dispatched dispatch(const Exec& ex, const Tensor& x, const Tensor& expert_ids,
                      const Tensor& weights, Workspace& ws) override;
  void combine(const Exec& ex, const Tensor& y, const Dispatched& d, const Tensor& out) override;

 private:
  int64_t num_experts_;
};

}  // namespace loom
