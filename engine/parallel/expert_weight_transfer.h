// Moving routed-expert weights between expert-parallel ranks when the load balancer re-places
// experts (issue 16, item 5). Each rank holds only its physical slots of every MoE layer
// (Placement::expert_slots at load); a new placement gives some slots other experts, and their
// weights must reach the rank before the first step that routes tokens to them.
//
// Where they come from: a rank that holds the expert under the old placement (every expert has at
// least one copy), through the communicator, as an NCCL deployment moves them over NVLink or
// InfiniBand: no disk or host read on the serving path, and the weights moved are the ones the
// ranks serve, so weights updated in place since the load (RL) move as they are, where re-reading
// the checkpoint would bring back stale ones. docs/expert-parallel.md has the reasoning.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "engine/parallel/communicator.h"
#include "engine/parallel/expert_placement.h"
#include "weights/model_config.h"
#include "weights/parameter_arena.h"

namespace loom {

// One MoE layer's routed-expert weights on one rank, indexed by local slot: gate and up
// [S, I, D], down [S, D, I], of the model's matrix dtype (f32, bf16, or stored FP8 with their
// block scales). Views of the model's parameters: writing them changes what the layer computes.
struct ExpertSlotWeights {
  Tensor gate, up, down;
};

// The slot weights of every MoE layer of a model loaded into `arena`, in layer order (the
// canonical names layers.L.moe.experts.{gate,up,down}). InvalidArgument when one is missing or
// the three disagree on the slot count.
absl::StatusOr<std::vector<ExpertSlotWeights>> find_expert_slot_weights(const ParameterArena& arena,
                                                                        const ModelConfig& cfg);

// Bytes of routed-expert weights in `arena` (FP8 block scales included): what expert parallelism
// divides among the ranks.
size_t expert_weight_bytes(const ParameterArena& arena);

// Applies a re-placement to one rank's weights. Every rank of the group calls apply for every MoE
// layer of a re-placement, in the same order, with the same placements (a collective).
class ExpertWeightTransfer {
 public:
  virtual ~ExpertWeightTransfer() = default;

  // Before: slot s of `weights` holds expert from.rank_experts[rank][s]; after: expert
  // to.rank_experts[rank][s], the same bits as the rank that held it sent. The two placements
  // have the same slot counts per rank. An error fails the group (the caller aborts the
  // communicator); the weights are then unspecified.
  virtual absl::Status apply(const ExpertPlacement& from, const ExpertPlacement& to,
                             const ExpertSlotWeights& weights) = 0;

  // Totals over the calls so far on this rank: expert matrices (gate, up and down of one expert
  // count one) received from other ranks, and the bytes of them.
  struct Moved {
    int64_t experts = 0;
    int64_t bytes = 0;
  };
  virtual Moved moved() const = 0;
};

// Through Communicator::all_to_all: each new slot's expert comes from the rank's own old slot
// when it held the expert, else from copy (rank + slot) mod copies of the old placement's copies
// (spreading a hot expert's sends over its holders). Buffers are taken on the weights' device
// with the tensors' own copies, so the same code serves any Communicator (thread ranks today,
// NCCL's device buffers later); the staging holds one matrix of one layer on the rank.
class CommunicatorExpertWeightTransfer final : public ExpertWeightTransfer {
 public:
  // `comm` must outlive this; used by the rank's thread only.
  explicit CommunicatorExpertWeightTransfer(Communicator& comm) : comm_(comm) {}

  absl::Status apply(const ExpertPlacement& from, const ExpertPlacement& to,
                     const ExpertSlotWeights& weights) override;
  Moved moved() const override { return moved_; }

 private:
  Communicator& comm_;
  Moved moved_;
};

}  // namespace loom
