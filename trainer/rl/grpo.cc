#include "trainer/rl/grpo.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace loom {

absl::Status GrpoOptions::validate() const {
  auto bad = [](const char* field, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("grpo.", field, ": ", why));
  };
  if (!(std_eps > 0 && std_eps <= 1)) return bad("std_eps", "must be in (0, 1]");
  if (!(clip_low >= 0 && clip_low < 1)) return bad("clip_low", "must be in [0, 1)");
  if (!(clip_high >= 0 && clip_high <= 100)) return bad("clip_high", "must be in [0, 100]");
  if (!(kl_coef >= 0 && kl_coef <= 100)) return bad("kl_coef", "must be in [0, 100]");
  if (!(tis_cap == 0 || (tis_cap >= 1 && tis_cap <= 1e6)))
    return bad("tis_cap", "must be 0 (off) or in [1, 1e6]");
  if (overlong_max_len < 0) return bad("overlong_max_len", "must be >= 0");
  if (overlong_max_len > 0 && !(overlong_buffer >= 1 && overlong_buffer <= overlong_max_len))
    return bad("overlong_buffer", "must be in [1, overlong_max_len]");
  if (overlong_max_len == 0 && overlong_buffer != 0)
    return bad("overlong_buffer", "only with overlong_max_len");
  if (!(overlong_penalty >= 0 && overlong_penalty <= 100))
    return bad("overlong_penalty", "must be in [0, 100]");
  return absl::OkStatus();
}

std::vector<double> group_advantages(std::span<const double> rewards, const GrpoOptions& options) {
  std::vector<double> out(rewards.size(), 0.0);
  if (rewards.empty()) return out;
  double mean = 0;
  for (double r : rewards) mean += r;
  mean /= static_cast<double>(rewards.size());
  double var = 0;
  for (double r : rewards) var += (r - mean) * (r - mean);
  const double std = std::sqrt(var / static_cast<double>(rewards.size()));
  for (size_t i = 0; i < rewards.size(); ++i)
    out[i] =
        options.scale_by_std ? (rewards[i] - mean) / (std + options.std_eps) : rewards[i] - mean;
  return out;
}

bool rewards_all_equal(std::span<const double> rewards) {
  return std::all_of(rewards.begin(), rewards.end(),
                     [&](double r) { return r == rewards.front(); });
}

double overlong_penalty(int64_t length, const GrpoOptions& o) {
  if (o.overlong_max_len == 0) return 0;
  const int64_t free = o.overlong_max_len - o.overlong_buffer;
  if (length <= free) return 0;
  if (length > o.overlong_max_len) return -o.overlong_penalty;
  return -o.overlong_penalty * static_cast<double>(length - free) /
         static_cast<double>(o.overlong_buffer);
}

bool score_group(TrajectoryGroup& group, const GrpoOptions& options) {
  std::vector<double> rewards;
  for (Trajectory& tr : group.members) {
    tr.reward = tr.task_reward + overlong_penalty(tr.response_tokens, options);
    tr.advantage = 0;
    rewards.push_back(tr.reward);
  }
  if (options.drop_equal_reward_groups && rewards_all_equal(rewards)) return false;
  const std::vector<double> adv = group_advantages(rewards, options);
  for (size_t i = 0; i < adv.size(); ++i) group.members[i].advantage = adv[i];
  return true;
}

TokenTerm grpo_token_term(const TokenInputs& in, const GrpoOptions& o) {
  TokenTerm t;
  t.ratio = std::exp(in.logp - in.old_logp);
  t.tis = o.tis_cap > 0 ? std::min(std::exp(in.old_logp - in.behav_logp), o.tis_cap) : 1.0;
  const double a = in.advantage;
  const double clipped_ratio = std::clamp(t.ratio, 1.0 - o.clip_low, 1.0 + o.clip_high);
  const double unclipped = t.ratio * a, clipped = clipped_ratio * a;
  // min(r A, clip(r) A): the clipped branch wins (and carries no gradient) only where it is
  // strictly smaller, i.e. where the ratio has left the range in the direction A rewards.
  t.clipped = clipped < unclipped;
  const double surrogate = t.clipped ? clipped : unclipped;
  t.loss = -t.tis * surrogate;
  t.d_logp = t.clipped ? 0.0 : -t.tis * unclipped;  // d(r A)/d logp = r A
  if (o.kl_coef > 0) {
    const double x = in.ref_logp - in.logp;
    t.kl = std::exp(x) - x - 1.0;
    t.loss += o.kl_coef * t.kl;
    t.d_logp += o.kl_coef * (1.0 - std::exp(x));  // d k3 / d logp = -e^x + 1
  }
  return t;
}

}  // namespace loom
