// Quantile load balancing of an MoE layer's routing bias (MODELS.md): after every step, from each
// expert's token count over the step (summed over all ranks), experts above the q_high quantile
// of the counts get bias -= eta and experts below the q_low quantile get bias += eta. The bias
// takes part in selection only (score + bias picks the top k; the gate weights use the score) and
// never receives a gradient, so balance costs no auxiliary loss term.
//
// Routing health is reported per layer and step, with warnings when it crosses thresholds.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loom {

// How a run keeps its MoE layers' load balanced (the run config's balance.method): not at all, by
// the auxiliary load-balancing loss (Gradients::set_aux_loss_alpha; the selection bias stays as it
// is), or by the quantile rule on the selection bias (the default; no loss term).
enum class BalanceMethod : uint8_t { kNone, kAuxLoss, kQuantile };
std::string_view balance_method_name(BalanceMethod method);  // "none", "aux_loss", "quantile"
// InvalidArgument listing the three names for anything else.
absl::StatusOr<BalanceMethod> parse_balance_method(std::string_view name);

struct QuantileBalancerOptions {
  double q_low = 0.25;   // experts with a count below this quantile get bias += eta
  double q_high = 0.75;  // experts with a count above this quantile get bias -= eta
  double eta = 1e-3;     // the bias step
  // Warning thresholds (routing_warnings).
  double warn_min_entropy = 0.9;         // normalised load entropy below this
  double warn_max_violation = 1.0;       // (max load - mean) / mean above this
  double warn_max_idle_fraction = 0.05;  // share of experts that got no token above this

  absl::Status validate() const;
};

struct RoutingHealth {
  double load_entropy = 0;    // entropy of the load distribution / log(E): 1 = uniform
  double max_violation = 0;   // (max count - mean) / mean
  double idle_fraction = 0;   // experts with no token / E
  double bias_update_l1 = 0;  // sum |bias change| over the experts this step
  int64_t raised = 0;         // experts given bias += eta
  int64_t lowered = 0;        // experts given bias -= eta
};

// The q-quantile of `counts` with linear interpolation between order statistics (numpy's
// default): q = 0 the smallest, q = 1 the largest.
double count_quantile(std::span<const int64_t> counts, double q);

// The load entropy, max violation and idle share of one layer's `counts` (no bias update).
RoutingHealth routing_health(std::span<const int64_t> counts);

// Updates `bias` (one entry per expert) from this step's `counts` and returns the step's health.
// The counts must already be summed over every rank (data parallel), so every rank applies the
// same update. An expert exactly at a quantile moves only when that puts it toward the mean load:
// at q_low with fewer tokens than the mean it is raised, at q_high with more it is lowered. Without
// that tie rule a collapsed router ([0, 0, 0, 0, 0, 0, N, N]: q_low is 0) would never raise its
// idle experts; a uniform load is left alone.
RoutingHealth quantile_balance_step(const QuantileBalancerOptions& options,
                                    std::span<const int64_t> counts, std::span<float> bias);

// Human-readable warnings for the thresholds `health` crosses (empty when healthy).
std::vector<std::string> routing_warnings(const QuantileBalancerOptions& options, int layer,
                                          const RoutingHealth& health);

}  // namespace loom
