// One optimizer step of the trainer: gradients of a micro-batch of examples (accumulated), the
// global norm and its clipping, then AdamW on every parameter that received a gradient. f32
// master weights, gradients and moments on the model's device (the CPU or a GPU); the model must
// be loaded with Placement::trainable.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/gradients.h"
#include "engine/model/model.h"
#include "engine/parallel/communicator.h"
#include "trainer/load_balancer.h"
#include "trainer/lr_schedule.h"
#include "trainer/synthetic_tasks.h"

namespace loom {

struct OptimizerOptions {
  LrSchedule lr;
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.1f;  // matrices only: norms, biases and gate parameters (1-D) get none
  double clip_norm = 1.0;     // global gradient norm bound; <= 0: no clipping
  // MoE load balancing: quantile balancing of every MoE layer's selection bias after each step
  // (no gradient; `balancer`), the auxiliary load-balancing loss with coefficient aux_loss_alpha
  // added to each example's objective (kernels/moe.h, moe_aux_loss_forward_backward), or none.
  BalanceMethod balance = BalanceMethod::kQuantile;
  QuantileBalancerOptions balancer;  // the quantile rule's options and every method's warnings
  double aux_loss_alpha = 1e-2;      // in (0, 1e3]; read with BalanceMethod::kAuxLoss only
  // run() packs consecutive examples of a batch into one forward and backward
  // (Model::loss_and_gradients_packed) while their tokens fit this budget (an example longer than
  // it runs alone); 0: one call per example. The same objective either way, up to f32 summation
  // order; packing is what keeps a GPU's GEMMs busy (docs/trainer.md).
  int64_t max_tokens_per_pass = 16384;

  absl::Status validate() const;
};

struct StepStats {
  int64_t step = 0;  // 1 for the first update
  double loss = 0;   // mean over the micro-batch of each example's mean loss
  // kAuxLoss: the mean over the micro-batch of each example's load-balancing loss (summed over
  // the MoE layers), which the gradient includes and `loss` does not; 0 otherwise.
  double aux_loss = 0;
  double grad_norm = 0;  // global norm of the mean gradient, before clipping
  double lr = 0;
  int64_t tokens = 0;  // tokens run through the model
  // Per position t (predicting token t + 1) over the batch: the sum of the scored positions'
  // losses and how many were scored (as long as the longest example), for loss_by_position.
  std::vector<double> position_loss;
  std::vector<int64_t> position_scored;
  // Per MoE selection bias (canonical name): the step's expert counts and routing health, with
  // kQuantile after the balancer moved the bias (empty without MoE layers with a selection bias).
  struct Routing {
    std::string bias;
    std::vector<int64_t> counts;
    RoutingHealth health;
  };
  std::vector<Routing> routing;
};

class TrainStep {
 public:
  // FailedPrecondition unless `model` was loaded trainable; InvalidArgument for bad options.
  static absl::StatusOr<TrainStep> create(const Model& model, const OptimizerOptions& options);

  // One update from `batch` (each example's gradient averaged over the batch; with kAuxLoss each
  // example's objective is its loss plus its load-balancing loss), then, with kQuantile, the
  // quantile balancer on every MoE selection bias from the batch's expert counts.
  absl::StatusOr<StepStats> run(std::span<const Example> batch);
  int64_t steps() const { return step_; }

  // Data parallelism (trainer/data_parallel.h): this step is rank comm->rank() of comm->size()
  // replicas, each created from the same weights and options. run() then takes the whole batch
  // on every rank, runs this rank's share (rank_share), and sums the gradients, the statistics and
  // the expert counts over the ranks before the update, so that every rank returns the same stats
  // and applies the same update (the batch size a multiple of the ranks; InvalidArgument
  // otherwise). Every rank must call run() in lockstep. null: a single replica.
  void set_data_parallel(Communicator* comm) { dp_ = comm; }

  // The same update from gradients a caller accumulates itself (a policy-gradient objective,
  // trainer/rl): begin() zeroes the gradients and returns them, the caller's backward passes add
  // into them, and update() multiplies them by `scale` (1 / examples for a mean; 1 when the
  // objective is already normalised), takes the global norm, clips, runs AdamW and balances the
  // MoE biases as run() does. The returned stats have grad_norm, lr, step and routing only.
  Gradients& begin(float aux_loss_alpha = 0.0f);
  absl::StatusOr<StepStats> update(double scale);

  // The optimizer state (step count and both moments of every parameter, by canonical name) as
  // host tensors, and back: what a checkpoint saves so a resumed run continues the same updates.
  std::vector<std::pair<std::string, Tensor>> state() const;
  // InvalidArgument naming a missing or misshapen moment, or a bad step count.
  absl::Status restore(const std::vector<std::pair<std::string, Tensor>>& state);

 private:
  TrainStep(const Model& model, const OptimizerOptions& options)
      : model_(&model), options_(options) {}

  // run()'s data-parallel tail: the loss, tokens and per-position sums over the ranks.
  absl::Status sum_stats_over_ranks(std::span<const Example> batch, StepStats& stats) const;

  struct Moments {
    Tensor param, m, v;
    bool decay = false;
  };
  const Model* model_;
  OptimizerOptions options_;
  std::vector<std::pair<std::string, Moments>> moments_;  // canonical name order of the arena
  Gradients grads_;
  Tensor sums_;  // [parameters] f32 on the model's device: the gradients' sums of squares
  int64_t step_ = 0;
  Communicator* dp_ = nullptr;
  Tensor dp_part_;  // all_reduce_sum's scratch
};

}  // namespace loom
