// Where the physical copies of one MoE layer's experts live across expert-parallel ranks, and how
// to choose them so the ranks carry even loads (an expert-parallel load balancer in the manner of
// DeepSeek's EPLB): the hottest experts get redundant copies, the copies are packed onto ranks
// longest-first, and each token's slot is routed to one copy. Pure arithmetic on counts: no
// tensors, no communication (ExpertLoadBalancer in expert_parallel_dispatcher.h drives it).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"

namespace loom {

// One layer's placement: E logical experts over R ranks in E + K physical slots.
struct ExpertPlacement {
  int64_t num_experts = 0;
  int num_ranks = 0;
  // rank_experts[r]: the logical expert of each of rank r's physical slots, ascending (a repeated
  // id only where every rank with a free slot already held that expert: see balanced_placement).
  std::vector<std::vector<int32_t>> rank_experts;
  // copies[e]: the rank of each physical copy of expert e, ascending; never empty.
  std::vector<std::vector<int32_t>> copies;

  int64_t num_slots() const;
  bool holds(int rank, int64_t expert) const;
};

// Each rank's number of physical slots: num_slots split as evenly as possible, the first
// num_slots % num_ranks ranks one more (the split expert_range_of_rank uses for experts).
std::vector<int64_t> expert_slot_capacities(int64_t num_slots, int num_ranks);

// InvalidArgument unless num_experts >= num_ranks >= 1 and 0 <= redundant <= num_experts *
// (num_ranks - 1) (beyond that some expert would need a second copy on one rank: no rank can
// serve a token faster by holding the same weights twice), and redundant == 0 when num_ranks == 1.
absl::Status check_redundant_experts(int64_t num_experts, int num_ranks, int64_t redundant);

// Today's layout, no redundancy: expert e on the rank whose expert_range_of_rank holds it
// (contiguous ranges, the first num_experts % num_ranks ranks one expert more).
ExpertPlacement contiguous_placement(int64_t num_experts, int num_ranks);

// The balanced placement of num_experts + redundant slots for per-expert loads `load` (token
// slots routed to each expert over some window; any non-negative counts):
//  1. replication: each of the `redundant` extra copies goes to the expert with the largest load
//     per copy (ties: the lower expert id), at most num_ranks copies of one expert;
//  2. packing: the copies, each carrying load / copies, heaviest first (ties: lower expert id),
//     each onto the least-loaded rank with a free slot that holds no copy of that expert yet
//     (ties: lower rank), or, where every rank with a free slot already holds one, the
//     least-loaded of those; ranks have expert_slot_capacities slots.
// Deterministic: a function of its arguments only. Requires check_redundant_experts to pass.
ExpertPlacement balanced_placement(std::span<const int64_t> load, int num_ranks, int64_t redundant);

// OK, or Internal naming the first broken invariant: every expert has 1..num_ranks copies, each
// rank holds exactly its expert_slot_capacities share of the slots, rank_experts and copies
// describe the same slots.
absl::Status check_placement(const ExpertPlacement& placement);

// The load each rank carries when every expert's load is split evenly over its copies (what
// route() does over many tokens).
std::vector<double> expert_rank_loads(const ExpertPlacement& placement,
                                      std::span<const int64_t> load);

// Mean over max of expert_rank_loads: 1.0 when every rank carries the same load (also when there
// is no load at all), 1 / num_ranks when one rank carries all of it.
double expert_load_balance(const ExpertPlacement& placement, std::span<const int64_t> load);

// The rank that computes slot (token token_index of rank my_rank, expert `expert`): my_rank when
// it holds a copy (the row need not travel), else copies[expert][(token_index + my_rank) %
// copies]: consecutive tokens take the copies in turn, and the turn starts at a different copy on
// each rank, so that decode steps of one token per rank do not all land on the first copy. Every
// rank computes the same answer for the same arguments, so all-gather ranks agree without talking.
int route_expert(const ExpertPlacement& placement, int64_t expert, int64_t token_index,
                 int my_rank);

// The per-layer, per-expert load of the last `steps` steps: a ring of per-step counts with
// running sums. Not thread-safe; one per rank.
class ExpertLoadWindow {
 public:
  // Requires num_layers >= 1, num_experts >= 1, steps >= 1.
  ExpertLoadWindow(int num_layers, int64_t num_experts, int steps);

  // Adds `count` slots routed to `expert` in `layer` to the current step.
  void add(int layer, int64_t expert, int64_t count = 1);
  // Closes the current step: the next one starts empty and, once `steps` are held, the oldest one
  // drops out of the sums.
  void next_step();
  // Per expert, the slots of `layer` over the held steps (the current one included).
  std::span<const int64_t> sum(int layer) const;
  // How many steps the sums cover (at most `steps`, counting the current one).
  int steps_held() const { return held_; }
  int num_layers() const { return num_layers_; }
  int64_t num_experts() const { return num_experts_; }

 private:
  int64_t* step_counts(int step, int layer);

  const int num_layers_;
  const int64_t num_experts_;
  const int steps_;
  int current_ = 0;  // ring index of the current step
  int held_ = 1;
  std::vector<int64_t> ring_;  // [steps][layers][experts]
  std::vector<int64_t> sums_;  // [layers][experts]
};

}  // namespace loom
