// Gradients: the parameter gradients of a backward pass, by canonical tensor name (the native
// format's names, docs/native-format.md), f32, created as zeros on first use and accumulated into
// by every op that reads the parameter (a tied or shared weight sums its uses). They live on the
// device of the model whose backward writes them (set_device before the first get()).
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace loom {

class Gradients {
 public:
  explicit Gradients(Device device = Device::kCpu) : device_(device) {}
  Device device() const { return device_; }
  // Moves an empty set to `device`; false (nothing changed) once a gradient exists elsewhere.
  bool set_device(Device device);

  // The gradient of `name`, zeros of `shape` the first time; later calls must ask for that shape.
  const Tensor& get(const std::string& name, const Shape& shape);
  // The gradient of `name`, or null when nothing has written it.
  const Tensor* find(std::string_view name) const;
  // Every name with a gradient, sorted.
  std::vector<std::string> names() const;
  // Sets every gradient to zero (the tensors stay, for the next step) and clears the counts.
  void zero();

  // Moves every gradient into one contiguous f32 block, in name order, zero-padded to a multiple
  // of `multiple` elements, and returns the block: what a data-parallel step sums over the ranks
  // in one collective. The values are kept; get() then hands out views into the block, and zero()
  // fills it in one call. A name first asked for after this gets a tensor of its own until the
  // next flatten() takes it in (the block is then rebuilt; nothing is rebuilt otherwise).
  const Tensor& flatten(int64_t multiple);

  // The routing of the same pass, for quantile load balancing (trainer/load_balancer.h): tokens
  // routed to each expert, summed over the pass, under the canonical name of the selection bias
  // they tune ("layers.L.moe.router.bias"). MoE layers without a bias report nothing.
  void add_expert_counts(const std::string& bias_name, const std::vector<int64_t>& counts);
  const std::map<std::string, std::vector<int64_t>>& expert_counts() const { return counts_; }

  // The auxiliary load-balancing loss (the trainer's balance.method "aux_loss"): with alpha > 0,
  // every MoE layer's backward adds alpha * E * sum_e f_e * P_e over the pass's tokens
  // (kernels/moe.h, moe_aux_loss_forward_backward) to the objective whose gradient it
  // accumulates, and its value to aux_loss(); Model::loss_and_gradients still returns the
  // cross-entropy alone. zero() clears the sum, not alpha.
  void set_aux_loss_alpha(float alpha) { aux_alpha_ = alpha; }
  float aux_loss_alpha() const { return aux_alpha_; }
  void add_aux_loss(double value) { aux_loss_ += value; }
  double aux_loss() const { return aux_loss_; }

 private:
  Device device_;
  std::map<std::string, Tensor, std::less<>> grads_;
  Tensor flat_;            // flatten()'s block, or undefined
  size_t flat_names_ = 0;  // how many of grads_ live in it (all of them, or it is stale)
  int64_t flat_multiple_ = 0;
  std::map<std::string, std::vector<int64_t>> counts_;
  float aux_alpha_ = 0.0f;
  double aux_loss_ = 0.0;
};

}  // namespace loom
