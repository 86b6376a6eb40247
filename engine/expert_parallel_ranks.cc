#include "engine/expert_parallel_ranks.h"

#include <omp.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "engine/parallel/expert_dispatcher_binding.h"
#include "engine/parallel/expert_weight_transfer.h"

namespace loom {

absl::Status check_expert_parallel_device(const Device& device, int ranks) {
  if (ranks >= 2 && !device.is_cpu())
    return absl::FailedPreconditionError(absl::StrCat(
        "--expert_parallel ", ranks, " on ", device_name(device),
        ": the ranks are threads on the CPU; NCCL ranks on GPUs are not built yet (issue 16)"));
  return absl::OkStatus();
}

absl::Status check_expert_parallel(const ModelConfig& cfg, const Device& device,
                                   const ExpertParallelOptions& options) {
  const int n = options.ranks;
  if (n < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("--expert_parallel ", n, ": expected a number of ranks >= 1"));
  if (n == 1) {
    if (options.balance.enabled())
      return absl::InvalidArgumentError(
          "--redundant_experts and --eplb_interval_steps balance experts over ranks: they need "
          "--expert_parallel N >= 2");
    return absl::OkStatus();
  }
  LOOM_RETURN_IF_ERROR(check_expert_parallel_device(device, n));
  const bool moe = std::find(cfg.ffns.begin(), cfg.ffns.end(), FfnType::kMoe) != cfg.ffns.end();
  if (!moe || cfg.moe.num_experts < n)
    return absl::InvalidArgumentError(
        absl::StrCat("--expert_parallel ", n,
                     " needs an MoE model with at least one expert per rank (", cfg.model_type,
                     moe ? absl::StrCat(" has ", cfg.moe.num_experts, " experts)")
                         : std::string(" has no MoE layers)")));
  if (options.timeout <= absl::ZeroDuration())
    return absl::InvalidArgumentError("--expert_parallel_timeout_s must be positive");
  LOOM_RETURN_IF_ERROR(check_expert_parallel_nodes(options.nodes, n));
  return check_expert_balance_options(options.balance, cfg.moe.num_experts, n);
}

absl::StatusOr<std::unique_ptr<ExpertParallelRanks>> ExpertParallelRanks::load(
    const ModelConfig& cfg, const Placement& placement, const ExpertParallelOptions& options,
    const Loader& loader) {
  LOOM_RETURN_IF_ERROR(check_expert_parallel(cfg, placement.device, options));
  std::unique_ptr<ExpertParallelRanks> out(new ExpertParallelRanks());
  const int n = options.ranks;
  // What the other nodes must run alike, besides the caller's settings: the options the ranks'
  // collectives and placement depend on.
  std::vector<std::pair<std::string, std::string>> settings = options.settings;
  settings.push_back({"model_type", cfg.model_type});
  settings.push_back({"experts", absl::StrCat(cfg.moe.num_experts, " top-", cfg.moe.top_k)});
  settings.push_back({"expert_dispatch", std::string(expert_exchange_name(options.exchange))});
  settings.push_back({"redundant_experts", absl::StrCat(options.balance.redundant_experts)});
  settings.push_back({"eplb_interval_steps", absl::StrCat(options.balance.interval_steps)});
  settings.push_back({"eplb_window_steps", absl::StrCat(options.balance.window_steps)});
  settings.push_back({"weight_dtype", std::string(weight_dtype_name(placement.dtype))});
  LOOM_ASSIGN_OR_RETURN(out->group_,
                        create_rank_group(options.nodes, n, options.timeout, std::move(settings)));
  const int local = out->group_->local_size();
  // The process's OpenMP threads (OMP_NUM_THREADS, else every core) shared out.
  out->threads_per_rank_ = std::max(1, omp_get_max_threads() / local);
  const int moe_layers =
      static_cast<int>(std::count(cfg.ffns.begin(), cfg.ffns.end(), FfnType::kMoe));
  for (int r = 0; r < local; ++r) {
    auto rank = std::make_unique<Rank>();
    Communicator& comm = out->group_->local_rank(r);
    Placement p = placement;
    // Loads run on this thread one after the other: nothing in a load is a collective, and each
    // binding ends with its load.
    if (options.balance.enabled()) {
      rank->balancer = std::make_unique<ExpertLoadBalancer>(comm, moe_layers, cfg.moe.num_experts,
                                                            options.balance);
      p.expert_slots = rank->balancer->load_slots();
      {
        const ScopedExpertDispatcher bind(rank->balancer->dispatcher_factory(options.exchange));
        LOOM_ASSIGN_OR_RETURN(rank->model, loader(p));
      }
      LOOM_ASSIGN_OR_RETURN(std::vector<ExpertSlotWeights> slots,
                            find_expert_slot_weights(rank->model->parameters(), cfg));
      LOOM_RETURN_IF_ERROR(rank->balancer->attach_weights(
          std::move(slots), std::make_unique<CommunicatorExpertWeightTransfer>(comm)));
      ExpertLoadBalancer* balancer = rank->balancer.get();
      rank->link.set_dummy_step = [balancer](bool dummy) { balancer->set_dummy_step(dummy); };
      if (r == 0) {
        ExpertParallelRanks* self = out.get();
        rank->link.after_step = [self, balancer] {
          const ExpertLoadBalancer::Balance& b = balancer->balance();
          if (b.replacements == self->replacements_.load(std::memory_order_relaxed)) return;
          self->balance_.store(b.before, std::memory_order_relaxed);
          self->replacements_.store(b.replacements, std::memory_order_relaxed);
        };
      }
    } else {
      rank->dispatcher =
          std::make_shared<ExpertParallelDispatcher>(comm, cfg.moe.num_experts, options.exchange);
      p.experts = rank->dispatcher->owned();
      {
        const ScopedExpertDispatcher bind(rank->dispatcher);
        LOOM_ASSIGN_OR_RETURN(rank->model, loader(p));
      }
      ExpertParallelDispatcher* d = rank->dispatcher.get();
      rank->link.set_dummy_step = [d](bool dummy) { d->set_dummy_step(dummy); };
    }
    rank->link.comm = &comm;
    out->ranks_.push_back(std::move(rank));
  }
  return out;
}

ExpertParallelRanks::~ExpertParallelRanks() {
  // The models hold their layers' dispatchers, which hold the communicators: models first.
  for (auto& r : ranks_) r->model.reset();
}

std::unique_ptr<Model> ExpertParallelRanks::take_model(int r) {
  return std::move(ranks_[r]->model);
}

void ExpertParallelRanks::abort(const absl::Status& why) { group_->abort(why); }

absl::Status ExpertParallelRanks::status() const {
  if (absl::Status st = group_->status(); !st.ok()) return st;
  return group_->departed();
}

std::optional<double> ExpertParallelRanks::load_balance() const {
  if (replacements_.load(std::memory_order_relaxed) == 0) return std::nullopt;
  return balance_.load(std::memory_order_relaxed);
}

}  // namespace loom
