// The dispatcher of a single rank, no communication: dispatch is a permutation of the slots by
// expert, combine its inverse with the weighted sum.
//
// Owning every expert (the default), it computes the whole layer. Owning a sub-range [begin, end)
// (a Placement with experts; the model then holds only those experts' weights), it is one rank's
// share of expert parallelism: slots routed to experts outside the range are not sent to the
// grouped GEMMs (row -1 in Dispatched::row_of_slot) and add nothing in combine, so each token gets
// the weighted sum over its owned choices only (zeros when it has none). The shares of ranks that
// cover every expert sum to the layer's routed output; moving the other slots to their owners
// and back is ExpertParallelDispatcher's job (expert_parallel_dispatcher.h).
// Activations follow the kernels (kernels/moe.h): f32, or bf16 on CUDA, forward only; the
// backwards take f32.
#pragma once

#include "engine/parallel/expert_dispatcher.h"

namespace loom {

class LocalExpertDispatcher final : public ExpertDispatcher {
 public:
  // Owns experts `owned` of `num_experts` (every one by default). Aborts on an empty range or one
  // outside [0, num_experts).
  explicit LocalExpertDispatcher(int64_t num_experts);
  LocalExpertDispatcher(int64_t num_experts, ExpertRange owned);

  ExpertRange owned() const override { return owned_; }
  Dispatched dispatch(const Exec& ex, const Tensor& x, const Tensor& expert_ids,
                      const Tensor& weights, Workspace& ws) override;
  void combine(const Exec& ex, const Tensor& y, const Dispatched& d, const Tensor& out) override;
  void combine_add(const Exec& ex, const Tensor& y, const Dispatched& d, const Tensor& out,
                   const Tensor& addend) override;
  // moe_unpermute_combine_backward: over a sub-range, d_weights holds this rank's share (zeros at
  // the slots of experts it does not own), and the shares of ranks covering every expert sum to
  // the layer's gradient, as the outputs do.
  void combine_backward(const Exec& ex, const Tensor& y, const Dispatched& d, const Tensor& d_out,
                        const Tensor& d_y, const Tensor& d_weights) override;
  // moe_permute_backward: only the owned slots add to d_x.
  void dispatch_backward(const Exec& ex, const Tensor& d_rows, const Dispatched& d,
                         const Tensor& d_x) override;

 private:
  int64_t num_experts_;
  ExpertRange owned_;
};

}  // namespace loom
