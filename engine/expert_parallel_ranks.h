// The ranks of an expert-parallel engine that run in this process (issue 16): copies of the
// model's attention and dense weights, each rank holding only its share of every MoE layer's
// experts, and the communicators and dispatchers (or the expert load balancer) that join them.
// Engine::create_expert_parallel runs one engine loop per local rank on them
// (engine/engine_loop.h's EngineRankLink); loom-server --expert_parallel N builds them.
//
// All N ranks are threads of this process (ThreadGroup), or with --nnodes K this node's N / K of
// them, the nodes joined over TCP (engine/parallel/expert_parallel_nodes.h, tcp_communicator.h).
// The ranks run on the CPU: NCCL ranks on GPUs are not built, and a CUDA placement is refused.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/engine_loop.h"
#include "engine/model/model.h"
#include "engine/parallel/expert_load_balancer.h"
#include "engine/parallel/expert_parallel_dispatcher.h"
#include "engine/parallel/expert_parallel_nodes.h"
#include "engine/parallel/rank_group.h"

namespace loom {

struct ExpertParallelOptions {
  int ranks = 1;              // --expert_parallel: the whole group's (over every node)
  ExpertParallelNodes nodes;  // --nnodes, --node_rank, --coordinator
  ExpertExchange exchange = ExpertExchange::kAllGather;  // --expert_dispatch
  ExpertBalanceOptions balance;  // --redundant_experts, --eplb_interval_steps, --eplb_window_steps
  absl::Duration timeout = absl::Seconds(300);  // --expert_parallel_timeout_s: a rank waiting
                                                // longer at a collective fails the group
  // With --nnodes: what must be the same on every node besides these options (the model's
  // config.json, numerics flags), compared at the rendezvous.
  std::vector<std::pair<std::string, std::string>> settings;
};

// InvalidArgument unless `ranks` is in [1, the model's experts] for an MoE model, the device is the
// CPU (FailedPrecondition on CUDA: NCCL ranks do not exist yet), the balancer's options fit, and
// the node flags describe a group of `ranks` (check_expert_parallel_nodes).
absl::Status check_expert_parallel(const ModelConfig& cfg, const Device& device,
                                   const ExpertParallelOptions& options);
// Its device part alone (before a model is read): FailedPrecondition for ranks >= 2 off the CPU.
absl::Status check_expert_parallel_device(const Device& device, int ranks);

class ExpertParallelRanks {
 public:
  // How to load one rank's model: `placement` is the caller's with the rank's experts
  // (Placement::experts) or slots (Placement::expert_slots) set; Model::load or load_random.
  using Loader = std::function<absl::StatusOr<std::unique_ptr<Model>>(const Placement&)>;

  // With --nnodes, first meets the other nodes (the rendezvous, up to options.timeout). Then loads
  // this process's ranks' models (after check_expert_parallel), each with its experts'
  // dispatchers bound (expert_dispatcher_binding.h) and, with the balancer, its slot weights
  // attached.
  static absl::StatusOr<std::unique_ptr<ExpertParallelRanks>> load(
      const ModelConfig& cfg, const Placement& placement, const ExpertParallelOptions& options,
      const Loader& loader);
  ~ExpertParallelRanks();

  // The ranks in this process (all of them on one node), and the group's.
  int size() const { return static_cast<int>(ranks_.size()); }
  int world_size() const { return group_->size(); }
  // The group rank of local rank 0 (the local ranks are consecutive).
  int first_rank() const { return group_->first_rank(); }
  // Rank r's model until the engine takes it, then null.
  const Model* model(int r) const { return ranks_[r]->model.get(); }
  // Rank r's model (once: the engine takes it) and what ties its loop to the others'.
  std::unique_ptr<Model> take_model(int r);
  const EngineRankLink& link(int r) const { return ranks_[r]->link; }
  // OpenMP threads each rank's loop runs with: an equal share of the process's (OMP_NUM_THREADS,
  // else every core), at least one.
  int threads_per_rank() const { return threads_per_rank_; }
  // The rank whose failure ends the group (RankGroup::abort) and the group's status: its failure,
  // else (--nnodes) a node that has left it, without which the group cannot step.
  void abort(const absl::Status& why);
  absl::Status status() const;

  // The expert load balance (mean over max per-rank load of the routed slots, averaged over the
  // MoE layers) the ranks carried over the balancer's last window, at its last re-placement;
  // nullopt without re-placements (--eplb_interval_steps 0) or before the first.
  std::optional<double> load_balance() const;
  int64_t replacements() const { return replacements_.load(std::memory_order_relaxed); }

 private:
  struct Rank {
    std::unique_ptr<Model> model;
    std::shared_ptr<ExpertParallelDispatcher> dispatcher;  // contiguous ranges
    std::unique_ptr<ExpertLoadBalancer> balancer;          // or the balancer's slots
    EngineRankLink link;
  };
  ExpertParallelRanks() = default;

  std::unique_ptr<RankGroup> group_;  // first: destroyed after the dispatchers using it
  std::vector<std::unique_ptr<Rank>> ranks_;
  int threads_per_rank_ = 1;
  // Published by rank 0's loop after each step (the balancer is the loop thread's).
  std::atomic<double> balance_{1.0};
  std::atomic<int64_t> replacements_{0};
};

}  // namespace loom
