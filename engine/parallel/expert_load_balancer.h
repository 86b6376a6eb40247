// One rank's expert load balancer (issue 16, item 4): the placement of every MoE layer's experts
// and redundant copies over the expert-parallel ranks, the load window it is recomputed from, and
// the schedule that recomputes it. Every rank holds one and they stay identical: each placement
// is a function of the all-gathered window, computed at the same step on every rank.
//
// Steps: layer 0's dispatch opens a step (ranks run in lockstep, so every rank opens the same
// steps). Every interval_steps steps, before that step routes anything, the ranks all-gather
// their windows (their own tokens' slots per layer and expert) and each recomputes every layer's
// balanced_placement from the sums: the new placement applies from that step on, never in the
// middle of one.
//
// Weights: each rank loads only its physical slots (Placement::expert_slots = load_slots(), the
// same for every layer at first) and computes only the slots routed to its copies. With weights
// attached (attach_weights), a re-placement moves the weights of the experts it brings each rank
// through an ExpertWeightTransfer, for every layer, before the step routes anything: the step
// that re-places waits for it (ExpertWeightTransfer's comment says where the weights come from).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/parallel/communicator.h"
#include "engine/parallel/expert_dispatcher.h"
#include "engine/parallel/expert_placement.h"
#include "engine/parallel/expert_weight_transfer.h"

namespace loom {

enum class ExpertExchange : uint8_t;

// The balancer's flags (loom-conformance; the server's when it gets expert parallelism).
struct ExpertBalanceOptions {
  int64_t redundant_experts = 0;  // --redundant_experts: extra physical slots per layer (K)
  int interval_steps = 0;         // --eplb_interval_steps: re-place every this many; 0: never
  int window_steps = 0;           // --eplb_window_steps: steps of load counted; 0: the interval
  // Off: the dispatcher keeps the contiguous ranges and each rank loads only its range.
  bool enabled() const { return redundant_experts != 0 || interval_steps != 0; }
};

// InvalidArgument for a negative interval or window, a window without an interval, or
// redundant_experts that check_redundant_experts refuses for num_experts over num_ranks.
absl::Status check_expert_balance_options(const ExpertBalanceOptions& options, int64_t num_experts,
                                          int num_ranks);

class ExpertLoadBalancer {
 public:
  // For the rank comm.rank() of comm.size(), with `num_layers` MoE layers of `num_experts`
  // experts each. Requires check_expert_balance_options(options, ...) to pass. The initial
  // placement is balanced_placement of equal loads. `comm` must outlive the balancer, which is
  // used by the rank's thread only.
  ExpertLoadBalancer(Communicator& comm, int num_layers, int64_t num_experts,
                     const ExpertBalanceOptions& options);

  int num_layers() const { return static_cast<int>(placements_.size()); }
  int64_t num_experts() const { return num_experts_; }
  const ExpertPlacement& placement(int layer) const { return placements_.at(layer); }

  // Called by layer `layer`'s dispatch before it routes: layer 0 opens a step and re-places on
  // schedule (an all-gather: every rank reaches it at the same step).
  void begin_layer(int layer);
  // Counts the slots of this rank's tokens routed to each expert in `layer` (n expert ids).
  void count(int layer, const int32_t* expert_ids, int64_t n);

  // A dummy step (expert_parallel_dispatcher.h) for every layer's dispatcher of this rank.
  void set_dummy_step(bool dummy) { dummy_ = dummy; }
  bool dummy_step() const { return dummy_; }

  // At the last re-placement (1.0 before any), mean over layers of expert_load_balance over the
  // gathered window: of the placement that was in use (what the ranks carried), of the new one
  // (what it would have given), and of contiguous_placement (no balancer).
  struct Balance {
    double before = 1.0, after = 1.0, contiguous = 1.0;
    int64_t replacements = 0;
  };
  const Balance& balance() const { return balance_; }

  // The experts of this rank's slots to load the model with (Placement::expert_slots): the
  // initial placement's, the same for every layer. Only before the first re-placement.
  std::vector<int32_t> load_slots() const;

  // A factory for ScopedExpertDispatcher: called once per MoE layer as Model::load builds them,
  // in order, it gives layer i an ExpertParallelDispatcher of this balancer's layer i. The model
  // must be loaded with Placement::expert_slots = load_slots() (InvalidArgument when a layer's
  // weights hold another number of slots, or beyond num_layers MoE layers).
  std::function<absl::StatusOr<std::shared_ptr<ExpertDispatcher>>(int64_t, ExpertRange)>
  dispatcher_factory(ExpertExchange exchange);

  // The model's slot weights, one per MoE layer (find_expert_slot_weights of the model loaded
  // with load_slots()), and how re-placements move them. Required before the first re-placement
  // when interval_steps > 0: without it a re-placement fails the group. InvalidArgument for the
  // wrong number of layers or slots.
  absl::Status attach_weights(std::vector<ExpertSlotWeights> layers,
                              std::unique_ptr<ExpertWeightTransfer> transfer);
  // What the transfer moved so far (zeros without one).
  ExpertWeightTransfer::Moved weights_moved() const;

 private:
  void replace();

  Communicator& comm_;
  const int64_t num_experts_;
  const ExpertBalanceOptions options_;
  std::vector<ExpertPlacement> placements_;  // per MoE layer
  ExpertLoadWindow window_;
  int64_t steps_begun_ = 0;
  bool dummy_ = false;
  Balance balance_;
  std::vector<ExpertSlotWeights> weights_;  // per MoE layer; empty until attach_weights
  std::unique_ptr<ExpertWeightTransfer> transfer_;
};

}  // namespace loom
