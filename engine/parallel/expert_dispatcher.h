// The seam of expert parallelism in an MoE layer: router -> dispatch -> grouped expert GEMMs ->
// combine. The layer is written once against this interface; whether one rank holds every expert
// or the experts are spread over ranks (threads, NCCL all-to-all) is the dispatcher's choice, never
// a change to the layer.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "core/workspace.h"
#include "kernels/exec.h"
#include "weights/parameter_arena.h"  // ExpertRange: the same type as the weights' Placement

namespace loom {

// What dispatch hands the rank: the rows to run through its experts, grouped by expert (the
// input of moe_grouped_swiglu), and what combine needs to bring the results back. The tensors are
// views of the workspace passed to dispatch: valid until the caller's Workspace::Mark ends.
struct Dispatched {
  Tensor rows;     // [R, D]
  Tensor offsets;  // [owned().count() + 1] i32: owned expert begin + e has rows
                   // [offsets[e], offsets[e + 1])
  // For combine: where the output of slot (token t, choice i) will be found (-1: nowhere on this
  // rank), and the router's gate weights [T, K] f32.
  Tensor row_of_slot;
  Tensor weights;
};

class ExpertDispatcher {
 public:
  virtual ~ExpertDispatcher() = default;

  // The experts whose weights this rank holds ([begin, end) of the layer's experts): the model
  // loads exactly these (Placement::experts), so the two always agree.
  virtual ExpertRange owned() const = 0;

  // Sends each (token, choice) slot of x [T, D] to the rank owning expert_ids[t, i]; returns the
  // rows this rank must compute. Every rank calls it, with or without tokens (collectives).
  virtual Dispatched dispatch(const Exec& ex, const Tensor& x, const Tensor& expert_ids,
                              const Tensor& weights, Workspace& ws) = 0;

  // y: [R, D], the expert outputs of d.rows. Brings them back to their tokens' ranks and writes
  // out[t] = sum of weights[t, i] * output of slot (t, i), summed in top-k order (batch
  // invariance: a token's sum never depends on where its experts ran).
  virtual void combine(const Exec& ex, const Tensor& y, const Dispatched& d, const Tensor& out) = 0;
};

}  // namespace loom
