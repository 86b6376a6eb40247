#include "engine/parallel/expert_load_balancer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "engine/parallel/expert_parallel_dispatcher.h"

namespace loom {

absl::Status check_expert_balance_options(const ExpertBalanceOptions& options, int64_t num_experts,
                                          int num_ranks) {
  if (options.interval_steps < 0)
    return absl::InvalidArgumentError(absl::StrCat("--eplb_interval_steps ", options.interval_steps,
                                                   ": expected >= 0 (0: never re-place)"));
  if (options.window_steps < 0)
    return absl::InvalidArgumentError(absl::StrCat("--eplb_window_steps ", options.window_steps,
                                                   ": expected >= 0 (0: the interval)"));
  if (options.window_steps > 0 && options.interval_steps == 0)
    return absl::InvalidArgumentError(
        absl::StrCat("--eplb_window_steps ", options.window_steps,
                     " counts load for re-placement, which --eplb_interval_steps 0 never does"));
  if (options.interval_steps > 0 && num_ranks < 2)
    return absl::InvalidArgumentError(
        absl::StrCat("--eplb_interval_steps ", options.interval_steps,
                     ": re-placing experts needs expert parallelism over 2 or more ranks"));
  return check_redundant_experts(num_experts, num_ranks, options.redundant_experts);
}

ExpertLoadBalancer::ExpertLoadBalancer(Communicator& comm, int num_layers, int64_t num_experts,
                                       const ExpertBalanceOptions& options)
    : comm_(comm),
      num_experts_(num_experts),
      options_(options),
      window_(
          num_layers, num_experts,
          std::max(1, options.window_steps > 0 ? options.window_steps : options.interval_steps)) {
  const absl::Status valid = check_expert_balance_options(options, num_experts, comm.size());
  LOOM_CHECK(valid.ok(), "ExpertLoadBalancer: %s", valid.ToString());
  // Before any load is known every expert is assumed equally hot: the copies go to the lowest
  // expert ids and the packing spreads them, the same on every rank.
  const std::vector<int64_t> equal(static_cast<size_t>(num_experts), 1);
  placements_.assign(static_cast<size_t>(num_layers),
                     balanced_placement(equal, comm.size(), options.redundant_experts));
}

void ExpertLoadBalancer::begin_layer(int layer) {
  LOOM_CHECK(layer >= 0 && layer < num_layers(), "ExpertLoadBalancer: layer %d of %d", layer,
             num_layers());
  if (layer != 0) return;
  if (steps_begun_ > 0) {
    if (options_.interval_steps > 0 && steps_begun_ % options_.interval_steps == 0) replace();
    window_.next_step();
  }
  ++steps_begun_;
}

void ExpertLoadBalancer::count(int layer, const int32_t* expert_ids, int64_t n) {
  for (int64_t j = 0; j < n; ++j) window_.add(layer, expert_ids[j]);
}

void ExpertLoadBalancer::replace() {
  const int n = comm_.size(), layers = num_layers();
  const int64_t per_rank = static_cast<int64_t>(layers) * num_experts_;
  Tensor mine = Tensor::empty({1, per_rank}, DType::kI64);
  for (int l = 0; l < layers; ++l) {
    const std::span<const int64_t> s = window_.sum(l);
    std::copy(s.begin(), s.end(), mine.data<int64_t>() + l * num_experts_);
  }
  Tensor all = Tensor::empty({n, per_rank}, DType::kI64);
  // A failed gather keeps the placements: the group has failed and the step's results are
  // discarded by every rank's driver (comm.status()).
  if (!comm_.all_gather(mine, all).ok()) return;
  const ExpertPlacement contiguous = contiguous_placement(num_experts_, n);
  Balance b{.before = 0, .after = 0, .contiguous = 0, .replacements = balance_.replacements + 1};
  std::vector<int64_t> load(static_cast<size_t>(num_experts_));
  for (int l = 0; l < layers; ++l) {
    std::fill(load.begin(), load.end(), 0);
    for (int q = 0; q < n; ++q)
      for (int64_t e = 0; e < num_experts_; ++e)
        load[e] += all.data<int64_t>()[q * per_rank + l * num_experts_ + e];
    b.before += expert_load_balance(placements_[l], load);
    ExpertPlacement next = balanced_placement(load, n, options_.redundant_experts);
    // The weights of the experts the new placement brings each rank, before any step routes to
    // them; a failure fails the group (every rank's driver sees it in comm.status()).
    const absl::Status moved =
        next.rank_experts == placements_[l].rank_experts ? absl::OkStatus()
        : transfer_ == nullptr
            ? absl::FailedPreconditionError(
                  "expert re-placement: the ranks hold only their slots' weights and none were "
                  "attached to the load balancer to move (ExpertLoadBalancer::attach_weights)")
            : transfer_->apply(placements_[l], next, weights_[l]);
    if (!moved.ok()) {
      comm_.abort(moved);
      return;
    }
    placements_[l] = std::move(next);
    b.after += expert_load_balance(placements_[l], load);
    b.contiguous += expert_load_balance(contiguous, load);
  }
  b.before /= layers;
  b.after /= layers;
  b.contiguous /= layers;
  balance_ = b;
}

std::function<absl::StatusOr<std::shared_ptr<ExpertDispatcher>>(int64_t, ExpertRange)>
ExpertLoadBalancer::dispatcher_factory(ExpertExchange exchange) {
  return [this, exchange, next = 0](
             int64_t num_experts,
             ExpertRange owned) mutable -> absl::StatusOr<std::shared_ptr<ExpertDispatcher>> {
    if (next >= num_layers())
      return absl::InvalidArgumentError(absl::StrCat("the expert load balancer was made for ",
                                                     num_layers(),
                                                     " MoE layers; the model has more"));
    const int64_t slots = static_cast<int64_t>(placements_[next].rank_experts[comm_.rank()].size());
    if (num_experts != num_experts_ || owned != ExpertRange{0, slots})
      return absl::InvalidArgumentError(absl::StrCat(
          "the expert load balancer places ", num_experts_, " experts per layer, ", slots,
          " slots on rank ", comm_.rank(),
          " (load the model with Placement::expert_slots = load_slots()); this layer has ",
          num_experts, " experts and its weights rows [", owned.begin, ", ", owned.end, ")"));
    return std::make_shared<ExpertParallelDispatcher>(comm_, *this, next++, exchange);
  };
}

}  // namespace loom

namespace loom {

std::vector<int32_t> ExpertLoadBalancer::load_slots() const {
  LOOM_CHECK(balance_.replacements == 0,
             "ExpertLoadBalancer::load_slots: after a re-placement the layers differ");
  return placements_.at(0).rank_experts[comm_.rank()];
}

absl::Status ExpertLoadBalancer::attach_weights(std::vector<ExpertSlotWeights> layers,
                                                std::unique_ptr<ExpertWeightTransfer> transfer) {
  if (static_cast<int>(layers.size()) != num_layers())
    return absl::InvalidArgumentError(absl::StrCat("expert weights of ", layers.size(),
                                                   " MoE layers for a balancer of ", num_layers()));
  for (int l = 0; l < num_layers(); ++l) {
    const int64_t slots = static_cast<int64_t>(placements_[l].rank_experts[comm_.rank()].size());
    if (layers[l].gate.dim(0) != slots)
      return absl::InvalidArgumentError(absl::StrCat("MoE layer ", l, ": weights ",
                                                     layers[l].gate.describe(), " for ", slots,
                                                     " slots on rank ", comm_.rank()));
  }
  if (transfer == nullptr) return absl::InvalidArgumentError("attach_weights: no transfer");
  weights_ = std::move(layers);
  transfer_ = std::move(transfer);
  return absl::OkStatus();
}

ExpertWeightTransfer::Moved ExpertLoadBalancer::weights_moved() const {
  return transfer_ != nullptr ? transfer_->moved() : ExpertWeightTransfer::Moved{};
}

}  // namespace loom
