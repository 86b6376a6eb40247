#include "trainer/load_balancer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status.h"

namespace loom {

absl::Status QuantileBalancerOptions::validate() const {
  if (!(q_low >= 0.0 && q_low <= q_high && q_high <= 1.0))
    return absl::InvalidArgumentError(
        absl::StrCat("quantile balancer: need 0 <= q_low <= q_high <= 1, got q_low ", q_low,
                     " q_high ", q_high));
  if (!(eta >= 0.0) || !std::isfinite(eta))
    return absl::InvalidArgumentError(
        absl::StrCat("quantile balancer: eta ", eta, " must be >= 0"));
  return absl::OkStatus();
}

std::string_view balance_method_name(BalanceMethod method) {
  switch (method) {
    case BalanceMethod::kNone:
      return "none";
    case BalanceMethod::kAuxLoss:
      return "aux_loss";
    case BalanceMethod::kQuantile:
      return "quantile";
  }
  return "?";
}

absl::StatusOr<BalanceMethod> parse_balance_method(std::string_view name) {
  for (BalanceMethod m : {BalanceMethod::kNone, BalanceMethod::kAuxLoss, BalanceMethod::kQuantile})
    if (name == balance_method_name(m)) return m;
  return absl::InvalidArgumentError(
      absl::StrCat("'", absl_sv(name), "' (none, aux_loss or quantile)"));
}

double count_quantile(std::span<const int64_t> counts, double q) {
  LOOM_CHECK(!counts.empty(), "count_quantile: no experts");
  std::vector<int64_t> sorted(counts.begin(), counts.end());
  std::sort(sorted.begin(), sorted.end());
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  return static_cast<double>(sorted[lo]) + frac * static_cast<double>(sorted[hi] - sorted[lo]);
}

RoutingHealth routing_health(std::span<const int64_t> counts) {
  LOOM_CHECK(!counts.empty(), "routing_health: no experts");
  RoutingHealth h;
  const double n = static_cast<double>(counts.size());
  int64_t total = 0, most = 0, idle = 0;
  for (int64_t c : counts) {
    LOOM_CHECK(c >= 0, "routing_health: negative count %lld", static_cast<long long>(c));
    total += c;
    most = std::max(most, c);
    idle += c == 0;
  }
  h.idle_fraction = static_cast<double>(idle) / n;
  if (total > 0) {
    const double mean = static_cast<double>(total) / n;
    h.max_violation = (static_cast<double>(most) - mean) / mean;
    double entropy = 0.0;
    for (int64_t c : counts) {
      if (c == 0) continue;
      const double p = static_cast<double>(c) / static_cast<double>(total);
      entropy -= p * std::log(p);
    }
    h.load_entropy = counts.size() > 1 ? entropy / std::log(n) : 1.0;
  }
  return h;
}

RoutingHealth quantile_balance_step(const QuantileBalancerOptions& options,
                                    std::span<const int64_t> counts, std::span<float> bias) {
  LOOM_CHECK(counts.size() == bias.size() && !counts.empty(),
             "quantile_balance_step: %zu counts for %zu biases", counts.size(), bias.size());
  RoutingHealth h = routing_health(counts);
  const double low = count_quantile(counts, options.q_low);
  const double high = count_quantile(counts, options.q_high);
  const float eta = static_cast<float>(options.eta);
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  const double mean = static_cast<double>(total) / static_cast<double>(counts.size());
  for (size_t e = 0; e < counts.size(); ++e) {
    const double c = static_cast<double>(counts[e]);
    if (c > high || (c == high && c > mean)) {
      bias[e] -= eta;
      ++h.lowered;
    } else if (c < low || (c == low && c < mean)) {
      bias[e] += eta;
      ++h.raised;
    }
  }
  h.bias_update_l1 = options.eta * static_cast<double>(h.raised + h.lowered);
  return h;
}

std::vector<std::string> routing_warnings(const QuantileBalancerOptions& options, int layer,
                                          const RoutingHealth& health) {
  std::vector<std::string> out;
  if (health.load_entropy < options.warn_min_entropy)
    out.push_back(absl::StrFormat("layer %d: load entropy %.3f below %.3f", layer,
                                  health.load_entropy, options.warn_min_entropy));
  if (health.max_violation > options.warn_max_violation)
    out.push_back(absl::StrFormat("layer %d: max violation %.3f above %.3f", layer,
                                  health.max_violation, options.warn_max_violation));
  if (health.idle_fraction > options.warn_max_idle_fraction)
    out.push_back(absl::StrFormat("layer %d: %.1f%% of experts idle (above %.1f%%)", layer,
                                  100 * health.idle_fraction,
                                  100 * options.warn_max_idle_fraction));
  return out;
}

}  // namespace loom
