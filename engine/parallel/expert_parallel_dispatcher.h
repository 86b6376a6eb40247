// Expert parallelism over a Communicator: each rank runs attention and the dense parts on its own
// tokens (data parallel) and holds a contiguous range of every MoE layer's experts; per MoE layer
// dispatch sends each (token, choice) slot to the rank owning its expert and combine brings the
// outputs back, summed on the token's own rank in top-k order exactly as the local combine does.
//
// Determinism: each expert sees exactly the rows, in exactly the order, that one rank holding every
// expert would give it for the concatenation of the ranks' tokens in rank order (slots ascending),
// and every slot's output comes back as the same bits (a copy, or a reduce-scatter where the other
// ranks add -0.0f, which leaves any float unchanged). So a token's output is bit-identical to a
// LocalExpertDispatcher's over that concatenation; a whole model over N ranks is then
// bit-identical to one rank wherever its other kernels compute a row independently of the rows
// around it (batch-invariant numerics, or one rank holding all the tokens of a step).
//
// Two exchanges (ExpertExchange); per MoE layer and rank, with T tokens here, T_cap the most of
// any rank, T_all their sum, K choices, N ranks:
//  - kAllGather: all-gather of the token counts, of x padded to T_cap rows and of the expert ids;
//    this rank's experts over every rank's tokens; a reduce-scatter of the per-slot outputs
//    [N * T_cap * K, D] (slots of other ranks' experts -0.0f). Static shapes once T_cap is a
//    fixed bucket (a GPU can capture it); the result moves K rows per token.
//    Dispatched: peer_counts [N] (tokens of each rank), moved_rows [T_all, K] (row of `rows` of
//    each gathered slot, -1 if not an owned expert), send_back [N * T_cap * K, D],
//    recv_back [T_cap * K, D], row_of_slot [T, K] = t * K + i (into recv_back).
//  - kAllToAll: every slot's row goes only to its expert's rank (grouped by rank, slot order
//    within), with its expert id; counts exchanged first (all-gather of N counts); the outputs
//    come back by the reverse all-to-all. Moves only the rows each rank needs.
//    Dispatched: peer_counts [2, N] (rows sent to, received from each rank), moved_rows [R_in, 1]
//    (row of `rows` of each received row), send_back [R_in, D], recv_back [T * K, D],
//    row_of_slot [T, K] (the row of recv_back holding each slot's output).
//
// Balanced (an ExpertLoadBalancer, expert_load_balancer.h): each MoE layer has its own dispatcher
// and placement; the rank holds the weights of its physical slots only (owned() is [0, S) of
// them, slot s holding expert placement.rank_experts[rank][s]: the model loaded with
// Placement::expert_slots, the balancer moving weights on re-placement) and computes the slots
// route_expert sends to its copies, grouped by local slot. An expert with copies on several ranks
// sees its rows split between them, each row computed as one rank would (the exchanges above are
// unchanged, the all-gather's rank skipping the gathered slots routed elsewhere), so the outputs
// match one rank wherever the grouped GEMMs compute a row independently of the rows around it.
//
// Host only (the thread communicator's memory; NCCL's dispatcher will be the GPU's), f32. Every
// rank calls dispatch and combine for every MoE layer of every step, a rank without tokens with
// T = 0. A failed collective (a rank failed, or timed out) leaves combine's output zero: the
// forward runs on to its end (every later collective fails at once) and the rank's driver must
// check comm.status() before using its results.
#pragma once

#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/parallel/communicator.h"
#include "engine/parallel/expert_dispatcher.h"
#include "engine/parallel/expert_load_balancer.h"

namespace loom {

enum class ExpertExchange : uint8_t { kAllGather, kAllToAll };

// "all_gather" or "all_to_all" (flags); InvalidArgument naming them otherwise.
absl::StatusOr<ExpertExchange> parse_expert_exchange(std::string_view name);
std::string_view expert_exchange_name(ExpertExchange exchange);

// The experts [begin, end) rank `rank` of `size` holds: contiguous ranges in rank order, the
// first num_experts % size ranks one expert more. Requires 1 <= size <= num_experts.
ExpertRange expert_range_of_rank(int64_t num_experts, int rank, int size);

class ExpertParallelDispatcher final : public ExpertDispatcher {
 public:
  // This rank holds expert_range_of_rank(num_experts, comm.rank(), comm.size()); `comm` must
  // outlive the dispatcher, which is used by the rank's thread only (one dispatcher may serve every
  // MoE layer of the rank's model: it keeps no state between calls).
  ExpertParallelDispatcher(Communicator& comm, int64_t num_experts, ExpertExchange exchange);
  // Balanced: MoE layer `layer` of `balancer`'s (which must outlive the dispatcher, as comm);
  // owned() is the rank's slots [0, S), and the dummy step is the balancer's (set there, for all
  // layers).
  ExpertParallelDispatcher(Communicator& comm, ExpertLoadBalancer& balancer, int layer,
                           ExpertExchange exchange);

  ExpertRange owned() const override { return owned_; }
  ExpertExchange exchange() const { return exchange_; }

  // A rank with no tokens for a step runs a dummy forward (one filler token through a scratch
  // cache) so that it issues every collective of the step; while `dummy` is set, dispatch sends
  // none of the rank's own rows (the others see it with zero tokens, so every expert gets exactly
  // the real tokens' rows) and combine writes zeros for them. Its experts serve the other ranks'
  // tokens as in any step. Set by the rank's driver between forwards.
  void set_dummy_step(bool dummy) { dummy_ = dummy; }

  Dispatched dispatch(const Exec& ex, const Tensor& x, const Tensor& expert_ids,
                      const Tensor& weights, Workspace& ws) override;
  void combine(const Exec& ex, const Tensor& y, const Dispatched& d, const Tensor& out) override;
  // The backwards move d_out (with the gate weights) to the experts' ranks and the gradients back
  // the same ways, and are bit-identical to the local dispatcher's as the forward is. They take
  // their exchange buffers from ex.workspace, which must be set.
  void combine_backward(const Exec& ex, const Tensor& y, const Dispatched& d, const Tensor& d_out,
                        const Tensor& d_y, const Tensor& d_weights) override;
  void dispatch_backward(const Exec& ex, const Tensor& d_rows, const Dispatched& d,
                         const Tensor& d_x) override;

 private:
  Dispatched dispatch_all_gather(const Tensor& x, const Tensor& expert_ids, const Tensor& weights,
                                 Workspace& ws);
  Dispatched dispatch_all_to_all(const Tensor& x, const Tensor& expert_ids, const Tensor& weights,
                                 Workspace& ws);
  // The Dispatched of a failed exchange: no rows; combine writes zeros.
  Dispatched failed(const Tensor& weights, int64_t d, Workspace& ws) const;
  int owner_of(int64_t expert) const;
  // Balanced: the rank's first slot holding each expert under the current placement, or -1.
  std::vector<int32_t> slot_of_expert() const;
  // The rank that computes slot (token t of rank `rank`, expert): owner_of, or balanced the
  // layer's route_expert.
  int destination(int64_t expert, int64_t t, int rank) const;
  bool dummy() const { return balancer_ != nullptr ? balancer_->dummy_step() : dummy_; }
  // Sends per-slot rows computed here (`rows`, in this rank's expert order: outputs, or their
  // gradients) back to the ranks of their tokens, into d.recv_back in each token's slot order,
  // through d.send_back. The all-gather exchange reduce-scatters with kNeutral padding; the
  // all-to-all one sends exactly the rows each rank gets back. False when the exchange failed.
  bool return_rows(const Tensor& rows, const Dispatched& d);

  Communicator& comm_;
  const int64_t num_experts_;
  const ExpertExchange exchange_;
  const ExpertRange owned_;
  ExpertLoadBalancer* const balancer_ = nullptr;  // null: contiguous ranges, no balancer
  const int layer_ = 0;                           // the balancer's MoE layer
  bool dummy_ = false;
};

}  // namespace loom
