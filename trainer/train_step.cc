#include "trainer/train_step.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/elementwise.h"
#include "kernels/optim.h"
#include "trainer/data_parallel.h"

namespace loom {

absl::Status OptimizerOptions::validate() const {
  LOOM_RETURN_IF_ERROR(lr.validate());
  LOOM_RETURN_IF_ERROR(balancer.validate());
  if (balance == BalanceMethod::kAuxLoss && !(aux_loss_alpha > 0 && aux_loss_alpha <= 1e3))
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer: aux_loss_alpha ", aux_loss_alpha, " outside (0, 1e3]"));
  if (max_tokens_per_pass < 0)
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer: max_tokens_per_pass ", max_tokens_per_pass, " is negative"));
  if (!(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1 && eps > 0 && weight_decay >= 0))
    return absl::InvalidArgumentError(absl::StrCat("optimizer: beta1 ", beta1, " beta2 ", beta2,
                                                   " eps ", eps, " weight_decay ", weight_decay,
                                                   " (betas in [0, 1), eps > 0, decay >= 0)"));
  return absl::OkStatus();
}

absl::StatusOr<TrainStep> TrainStep::create(const Model& model, const OptimizerOptions& options) {
  LOOM_RETURN_IF_ERROR(options.validate());
  if (!model.placement().trainable)
    return absl::FailedPreconditionError(
        "training: load the model with Placement::trainable (its weights are read-only)");
  TrainStep t(model, options);
  const Device device = model.placement().device;
  const Exec& ex = exec_for(device);
  auto zeros = [&](const Shape& shape) {
    Tensor z = Tensor::empty(shape, DType::kF32, device);
    zero_fill(ex, z);
    return z;
  };
  for (const ParameterArena::Entry& e : model.parameters().entries()) {
    if (e.tensor.dtype() != DType::kF32)
      return absl::FailedPreconditionError(
          absl::StrCat("training: parameter ", e.name, " is not f32"));
    Moments mo;
    mo.param = e.tensor;
    mo.m = zeros(e.tensor.shape());
    mo.v = zeros(e.tensor.shape());
    mo.decay = e.tensor.ndim() >= 2;
    t.moments_.emplace_back(e.name, std::move(mo));
  }
  t.grads_ = Gradients(device);
  t.sums_ = zeros({static_cast<int64_t>(t.moments_.size())});
  return t;
}

absl::StatusOr<StepStats> TrainStep::run(std::span<const Example> batch) {
  if (batch.empty()) return absl::InvalidArgumentError("training: an empty batch");
  std::span<const Example> mine = batch;
  if (dp_ != nullptr) {
    if (batch.size() % static_cast<size_t>(dp_->size()) != 0)
      return absl::InvalidArgumentError(absl::StrCat("training: a batch of ", batch.size(),
                                                     " examples over ", dp_->size(),
                                                     " data-parallel ranks"));
    const RankShare share = rank_share(batch.size(), dp_->rank(), dp_->size());
    mine = batch.subspan(share.begin, share.end - share.begin);
  }
  grads_.zero();
  grads_.set_aux_loss_alpha(options_.balance == BalanceMethod::kAuxLoss
                                ? static_cast<float>(options_.aux_loss_alpha)
                                : 0.0f);
  StepStats stats;
  std::vector<float> rows;
  std::vector<TrainingSequence> pass;
  for (size_t next = 0; next < mine.size();) {
    // The examples of this pass: consecutive ones while they fit the token budget.
    pass.clear();
    int64_t tokens = 0;
    for (; next < mine.size(); ++next) {
      const int64_t len = static_cast<int64_t>(mine[next].tokens.size());
      if (!pass.empty() &&
          (options_.max_tokens_per_pass == 0 || tokens + len > options_.max_tokens_per_pass))
        break;
      pass.push_back({mine[next].tokens, mine[next].loss_mask});
      tokens += len;
    }
    LOOM_ASSIGN_OR_RETURN(const std::vector<double> losses,
                          model_->loss_and_gradients_packed(pass, grads_, &rows));
    size_t row = 0;  // the first row of the pass's current example
    for (size_t i = 0; i < pass.size(); ++i) {
      const TrainingSequence& ex = pass[i];
      const size_t len = ex.tokens.size();
      stats.loss += losses[i] / static_cast<double>(batch.size());
      stats.tokens += static_cast<int64_t>(len);
      if (stats.position_loss.size() < len) {
        stats.position_loss.resize(len, 0.0);
        stats.position_scored.resize(len, 0);
      }
      for (size_t t = 0; t + 1 < len; ++t) {
        if (!ex.loss_mask.empty() && ex.loss_mask[t] == 0) continue;
        stats.position_loss[t] += rows[row + t];
        ++stats.position_scored[t];
      }
      row += len;
    }
  }
  stats.aux_loss = grads_.aux_loss() / static_cast<double>(batch.size());
  if (dp_ != nullptr) LOOM_RETURN_IF_ERROR(sum_stats_over_ranks(batch, stats));
  LOOM_ASSIGN_OR_RETURN(StepStats updated, update(1.0 / static_cast<double>(batch.size())));
  stats.grad_norm = updated.grad_norm;
  stats.step = updated.step;
  stats.lr = updated.lr;
  stats.routing = std::move(updated.routing);
  return stats;
}

Gradients& TrainStep::begin(float aux_loss_alpha) {
  grads_.zero();
  grads_.set_aux_loss_alpha(aux_loss_alpha);
  return grads_;
}

absl::Status TrainStep::sum_stats_over_ranks(std::span<const Example> batch,
                                             StepStats& stats) const {
  // Every rank packs the same layout: the positions of the batch's longest example.
  size_t longest = 0;
  for (const Example& e : batch) longest = std::max(longest, e.tokens.size());
  stats.position_loss.resize(longest, 0.0);
  stats.position_scored.resize(longest, 0);
  std::vector<double> v = {stats.loss, stats.aux_loss, static_cast<double>(stats.tokens)};
  v.insert(v.end(), stats.position_loss.begin(), stats.position_loss.end());
  v.insert(v.end(), stats.position_scored.begin(), stats.position_scored.end());
  LOOM_ASSIGN_OR_RETURN(const std::vector<double> sum,
                        sum_over_ranks(*dp_, v, model_->placement().device));
  stats.loss = sum[0];
  stats.aux_loss = sum[1];
  stats.tokens = static_cast<int64_t>(sum[2]);
  for (size_t t = 0; t < longest; ++t) {
    stats.position_loss[t] = sum[3 + t];
    stats.position_scored[t] = static_cast<int64_t>(sum[3 + longest + t]);
  }
  return absl::OkStatus();
}

absl::StatusOr<StepStats> TrainStep::update(double mean) {
  StepStats stats;
  const Device device = model_->placement().device;
  const Exec ex = exec_for(device);
  std::map<std::string, std::vector<int64_t>> counts = grads_.expert_counts();
  if (dp_ != nullptr) {
    // The ranks' gradients summed in one collective over one block; the expert counts too.
    LOOM_RETURN_IF_ERROR(all_reduce_sum(*dp_, grads_.flatten(dp_->size()), dp_part_));
    std::vector<double> packed;
    for (const auto& [name, c] : counts) packed.insert(packed.end(), c.begin(), c.end());
    LOOM_ASSIGN_OR_RETURN(const std::vector<double> sum, sum_over_ranks(*dp_, packed, device));
    size_t at = 0;
    for (auto& [name, c] : counts)
      for (int64_t& n : c) n = static_cast<int64_t>(sum[at++]);
  }
  // Global norm of the scaled gradient. When every gradient is a parameter's (always, but for a
  // caller's stray name), the gradients are one block (Gradients::flatten: also what makes
  // zero() one fill), its sum of squares is one reduction, and the update takes its clipped scale
  // from that sum where it lies (adamw_update_many: one launch, no read back before it);
  // otherwise each parameter's sum is read back and added in the arena's order.
  size_t with_grad = 0;
  for (const auto& [name, mo] : moments_) with_grad += grads_.find(name) != nullptr;
  ++step_;
  stats.step = step_;
  stats.lr = options_.lr.at(step_);
  AdamWStep s;
  s.lr = static_cast<float>(stats.lr);
  s.beta1 = options_.beta1;
  s.beta2 = options_.beta2;
  s.eps = options_.eps;
  s.step = step_;
  if (with_grad == grads_.names().size()) {
    const Tensor sum = sums_.slice(0, 0, 1);
    sum_of_squares(ex, grads_.flatten(dp_ != nullptr ? dp_->size() : 1), sum);
    std::vector<AdamWTensor> tensors;
    tensors.reserve(with_grad);
    for (const auto& [name, mo] : moments_) {
      const Tensor* g = grads_.find(name);
      if (g == nullptr) continue;  // no gradient (a routing bias): not an optimizer parameter
      tensors.push_back({mo.param, *g, mo.m, mo.v, mo.decay});
    }
    s.weight_decay = options_.weight_decay;
    adamw_update_many(
        ex, s, tensors,
        {.sum_squares = sum, .mean = mean, .clip_norm = std::max(0.0, options_.clip_norm)});
    float total = 0.0f;  // after the update is queued: the wait overlaps it
    download(ex, &total, sum.raw(), sizeof(total));
    stats.grad_norm = std::sqrt(static_cast<double>(total)) * mean;
  } else {
    std::vector<bool> has_grad(moments_.size(), false);
    for (size_t i = 0; i < moments_.size(); ++i) {
      const Tensor* g = grads_.find(moments_[i].first);
      if (g == nullptr) continue;
      has_grad[i] = true;
      sum_of_squares(ex, *g, sums_.slice(0, static_cast<int64_t>(i), static_cast<int64_t>(i) + 1));
    }
    const Tensor sums = sums_.to(Device::kCpu);
    double total = 0;
    for (size_t i = 0; i < moments_.size(); ++i)
      if (has_grad[i]) total += sums.data<float>()[i];
    stats.grad_norm = std::sqrt(total) * mean;
    s.grad_scale = static_cast<float>(clipped_grad_scale(total, mean, options_.clip_norm));
    for (auto& [name, mo] : moments_) {
      const Tensor* g = grads_.find(name);
      if (g == nullptr) continue;
      s.weight_decay = mo.decay ? options_.weight_decay : 0.0f;
      adamw_update(ex, s, mo.param, *g, mo.m, mo.v);
    }
  }
  for (const auto& [bias_name, layer_counts] : counts) {
    const Tensor* bias = model_->parameters().find(bias_name);
    if (bias == nullptr || bias->numel() != static_cast<int64_t>(layer_counts.size()))
      return absl::InternalError(
          absl::StrCat("training: no selection bias ", bias_name, " for its expert counts"));
    // The bias moves on the host (a few floats a layer) and goes back to the model's device.
    const Tensor host_bias = device.is_cpu() ? *bias : bias->to(Device::kCpu);
    const RoutingHealth health =
        options_.balance == BalanceMethod::kQuantile
            ? quantile_balance_step(options_.balancer, layer_counts,
                                    std::span<float>(host_bias.data<float>(), layer_counts.size()))
            : routing_health(layer_counts);
    if (!device.is_cpu() && options_.balance == BalanceMethod::kQuantile)
      bias->copy_from(host_bias);
    stats.routing.push_back({bias_name, layer_counts, health});
  }
  return stats;
}

std::vector<std::pair<std::string, Tensor>> TrainStep::state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  Tensor step = Tensor::empty({1}, DType::kI64);
  step.data<int64_t>()[0] = step_;
  out.emplace_back("step", step);
  for (const auto& [name, mo] : moments_) {
    out.emplace_back("adam_m." + name, mo.m.to(Device::kCpu));
    out.emplace_back("adam_v." + name, mo.v.to(Device::kCpu));
  }
  return out;
}

absl::Status TrainStep::restore(const std::vector<std::pair<std::string, Tensor>>& state) {
  auto find = [&](const std::string& name) -> const Tensor* {
    for (const auto& [n, t] : state)
      if (n == name) return &t;
    return nullptr;
  };
  const Tensor* step = find("step");
  if (step == nullptr || step->dtype() != DType::kI64 || step->numel() != 1 ||
      step->data<int64_t>()[0] < 0)
    return absl::InvalidArgumentError("trainer state: no valid 'step'");
  for (auto& [name, mo] : moments_) {
    for (auto [prefix, dst] : {std::pair{"adam_m.", &mo.m}, std::pair{"adam_v.", &mo.v}}) {
      const Tensor* t = find(prefix + name);
      if (t == nullptr || t->shape() != dst->shape() || t->dtype() != DType::kF32)
        return absl::InvalidArgumentError(
            absl::StrCat("trainer state: ", prefix, name, " missing or not f32 ", dst->describe()));
    }
  }
  for (auto& [name, mo] : moments_) {
    mo.m.copy_from(*find("adam_m." + name));
    mo.v.copy_from(*find("adam_v." + name));
  }
  step_ = step->data<int64_t>()[0];
  return absl::OkStatus();
}

}  // namespace loom
