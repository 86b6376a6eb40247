// The seam of expert parallelism in an MoE layer: router -> dispatch -> grouped expert GEMMs ->
// combine. The layer is written once against this interface; whether one rank holds every expert
// or the experts are spread over ranks (threads, NCCL all-to-all) is the dispatcher's choice, never
// a change to the layer.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "core/workspace.h"
#include "kernels/elementwise.h"
#include "kernels/exec.h"
#include "weights/parameter_arena.h"  // ExpertRange: the same type as the weights' Placement

namespace loom {

// What dispatch hands the rank: the rows to run through its experts, grouped by expert (the
// input of moe_grouped_swiglu), and what combine needs to bring the results back. The tensors are
// views of the workspace passed to dispatch: valid until the caller's Workspace::Mark ends.
struct Dispatched {
  Tensor rows;     // [R, D], of x's dtype (f32, or bf16 activations on CUDA)
  Tensor offsets;  // [owned().count() + 1] i32: owned expert (or slot) begin + e has rows
                   // [offsets[e], offsets[e + 1])
  // For combine: where the output of slot (token t, choice i) will be found (-1: nowhere on this
  // rank), and the router's gate weights [T, K] f32.
  Tensor row_of_slot;
  Tensor weights;
  // Expert parallelism only (ExpertParallelDispatcher; undefined for the local dispatcher): how
  // the slots travelled, so that combine and the backwards move results back the same way, and
  // combine's two exchange buffers, taken at dispatch (combine gets no workspace).
  // expert_parallel_dispatcher.h says what each holds for each exchange.
  Tensor peer_counts;  // i64 host: rows exchanged with each rank
  Tensor moved_rows;   // i32: where each row that arrived here sits in `rows`
  Tensor send_back, recv_back;
};

class ExpertDispatcher {
 public:
  virtual ~ExpertDispatcher() = default;

  // The rows of the layer's expert weights this rank holds: experts [begin, end) of the layer
  // (Placement::experts), or under a slot placement (Placement::expert_slots, the load
  // balancer's) its physical slots [0, S), the dispatcher knowing which expert each holds. The
  // model loads exactly these, so the two always agree.
  virtual ExpertRange owned() const = 0;

  // Sends each (token, choice) slot of x [T, D] (f32, or bf16 on CUDA) to the rank owning
  // expert_ids[t, i]; returns the rows this rank must compute, in x's dtype. Every rank calls it,
  // with or without tokens (collectives).
  virtual Dispatched dispatch(const Exec& ex, const Tensor& x, const Tensor& expert_ids,
                              const Tensor& weights, Workspace& ws) = 0;

  // y: [R, D], the expert outputs of d.rows. Brings them back to their tokens' ranks and writes
  // out[t] = sum of weights[t, i] * output of slot (t, i), summed in f32 in top-k order (batch
  // invariance: a token's sum never depends on where its experts ran). y and out are f32, or on
  // CUDA bf16 each (a bf16 out rounded once, after the sum).
  virtual void combine(const Exec& ex, const Tensor& y, const Dispatched& d, const Tensor& out) = 0;

  // combine, then out += addend ([T, D], out's shape and dtype: an MoE layer's shared expert
  // output), with exactly those bits. A dispatcher may do both in one pass (the local one does:
  // one kernel fewer a layer at decode).
  virtual void combine_add(const Exec& ex, const Tensor& y, const Dispatched& d, const Tensor& out,
                           const Tensor& addend) {
    combine(ex, y, d, out);
    add_inplace(ex, out, addend);
  }

  // Training: the backwards of combine and dispatch, called with the Dispatched of the step's
  // (recomputed) forward, combine_backward first. Every rank calls both (collectives): a
  // dispatcher that moved the slots moves their gradients the same way back.
  //
  // combine_backward: d_out [T, D], the gradient of combine's `out` on this rank's tokens. Writes
  // d_y [R, D], the gradient of y (weights[t, i] * d_out[t] at the row of slot (t, i); rows no
  // slot names untouched), and d_weights [T, K], the gradient of the gate weights
  // (d_out[t] . output of slot (t, i); zero for a slot no rank computed, as combine adds nothing
  // for it). A dispatcher that moves slots brings d_out to the rows' ranks and d_weights back.
  virtual void combine_backward(const Exec& ex, const Tensor& y, const Dispatched& d,
                                const Tensor& d_out, const Tensor& d_y,
                                const Tensor& d_weights) = 0;

  // dispatch_backward: d_rows [R, D], the gradient of d.rows. Adds to d_x [T, D] (accumulated)
  // the gradient of each token's slots, in top-k order (the same bits wherever the rows ran).
  virtual void dispatch_backward(const Exec& ex, const Tensor& d_rows, const Dispatched& d,
                                 const Tensor& d_x) = 0;
};

}  // namespace loom
