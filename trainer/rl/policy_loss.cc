#include "trainer/rl/policy_loss.h"

#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/exec.h"
#include "kernels/loss.h"
#include "trainer/rl/routing_replay.h"

namespace loom {

absl::StatusOr<std::vector<float>> token_logprobs(const Model& model,
                                                  std::span<const int32_t> tokens,
                                                  RoutingReplay* routing_replay) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n < 2) return absl::InvalidArgumentError("token_logprobs: fewer than 2 tokens");
  const Tensor* lm_head = model.parameters().find("lm_head.weight");
  if (lm_head == nullptr || lm_head->dtype() != DType::kF32)
    return absl::FailedPreconditionError(
        "token_logprobs: needs a model with f32 matrices (loaded trainable)");
  SequenceCache cache = model.new_cache();
  ForwardBatch batch;
  batch.token_ids.assign(tokens.begin(), tokens.end());
  batch.seqs.push_back({.num_tokens = n, .logits = LogitsMode::kNone, .cache = &cache});
  batch.routing_replay = routing_replay;
  ActivationTape tape({"final_normed"});
  LOOM_RETURN_IF_ERROR(model.forward(batch, &tape).status());
  const Tensor* hidden = tape.find(-1, "final_normed");
  if (hidden == nullptr) return absl::InternalError("token_logprobs: no final_normed recorded");
  // The training loss's kernel on the model's device (the rows the policy loss differentiates).
  const Device device = model.device();
  constexpr int64_t kIgnore = -100;
  Tensor targets = Tensor::empty({n}, DType::kI64);
  for (int64_t t = 0; t < n; ++t) targets.data<int64_t>()[t] = t + 1 < n ? tokens[t + 1] : kIgnore;
  targets = targets.to(device);
  Tensor loss = Tensor::empty({1}, DType::kF32, device);
  Tensor rows = Tensor::empty({n}, DType::kF32, device);
  cross_entropy_forward_backward(exec_for(device), *hidden, *lm_head, targets, kIgnore, 1.0f, loss,
                                 rows, Tensor(), Tensor());
  rows = rows.to(Device::kCpu);
  std::vector<float> out(n);
  for (int64_t t = 0; t < n; ++t) out[t] = -rows.data<float>()[t];
  return out;
}

absl::StatusOr<PolicyLossStats> accumulate_policy_gradient(
    const Model& model, std::span<const Trajectory* const> batch, const GrpoOptions& options,
    Gradients& grads, bool replay_routing, int64_t scored_version, int64_t pack_tokens) {
  if (pack_tokens < 0) pack_tokens = model.device().is_cpu() ? 0 : kPolicyPackTokens;
  // Routing replay's tensors would have to cover the concatenated rows: one pass per trajectory.
  const bool pack = pack_tokens > 0 && !replay_routing;
  PolicyLossStats s;
  for (const Trajectory* tr : batch) {
    const size_t n = tr->tokens.size();
    if (tr->sampled.size() != n || tr->behav_logp.size() != n || tr->old_logp.size() != n ||
        (options.kl_coef > 0 && tr->ref_logp.size() != n))
      return absl::InvalidArgumentError(
          absl::StrCat("policy loss: a trajectory of ", n, " tokens with ", tr->sampled.size(),
                       " mask entries, ", tr->behav_logp.size(), " behaviour and ",
                       tr->old_logp.size(), " rollout logprobs"));
    for (size_t i = 0; i + 1 < n; ++i) s.tokens += tr->sampled[i] != 0;
  }
  if (s.tokens == 0) return s;
  const double inv_n = 1.0 / static_cast<double>(s.tokens);
  int64_t clipped = 0;
  std::vector<float> weights;
  // Packed: the trajectories (and their weights) of the pass being gathered.
  std::vector<const Trajectory*> packed;
  std::vector<std::vector<float>> packed_weights;
  int64_t packed_tokens = 0;
  auto flush = [&]() -> absl::Status {
    if (packed.empty()) return absl::OkStatus();
    std::vector<TrainingSequence> seqs;
    for (size_t k = 0; k < packed.size(); ++k)
      seqs.push_back({.tokens = packed[k]->tokens,
                      .loss_mask = packed[k]->sampled,
                      .row_weights = packed_weights[k]});
    LOOM_RETURN_IF_ERROR(model.loss_and_gradients_packed(seqs, grads).status());
    packed.clear();
    packed_weights.clear();
    packed_tokens = 0;
    return absl::OkStatus();
  };
  for (const Trajectory* tr : batch) {
    const size_t n = tr->tokens.size();
    std::optional<RoutingReplay> replay;
    if (replay_routing) {
      LOOM_ASSIGN_OR_RETURN(replay, routing_replay_of(*tr, model.config(), /*apply=*/true));
    }
    RoutingReplay* routing = replay ? &*replay : nullptr;
    std::vector<float> fresh;
    if (scored_version < 0 || tr->version != scored_version) {
      LOOM_ASSIGN_OR_RETURN(fresh, token_logprobs(model, tr->tokens, routing));
    }
    const std::vector<float>& logp = fresh.empty() ? tr->old_logp : fresh;
    weights.assign(n, 0.0f);
    bool any = false;
    for (size_t i = 0; i + 1 < n; ++i) {
      if (!tr->sampled[i]) continue;
      TokenInputs in{.logp = logp[i],
                     .old_logp = tr->old_logp[i],
                     .behav_logp = tr->behav_logp[i],
                     .ref_logp = options.kl_coef > 0 ? tr->ref_logp[i] : 0.0,
                     .advantage = tr->advantage};
      const TokenTerm term = grpo_token_term(in, options);
      s.loss += term.loss * inv_n;
      s.entropy -= logp[i] * inv_n;
      s.kl += term.kl * inv_n;
      s.tis_mean += term.tis * inv_n;
      s.ratio_mean += term.ratio * inv_n;
      s.mismatch += std::fabs(tr->old_logp[i] - tr->behav_logp[i]) * inv_n;
      clipped += term.clipped;
      // row_loss = -logp: d L / d row_loss = -d_logp / N.
      weights[i] = static_cast<float>(-term.d_logp * inv_n);
      any |= weights[i] != 0.0f;
    }
    if (!any) continue;
    if (pack) {
      if (packed_tokens + static_cast<int64_t>(n) > pack_tokens) LOOM_RETURN_IF_ERROR(flush());
      packed.push_back(tr);
      packed_weights.push_back(weights);
      packed_tokens += static_cast<int64_t>(n);
      continue;
    }
    LOOM_RETURN_IF_ERROR(
        model.loss_and_gradients(tr->tokens, grads, tr->sampled, nullptr, weights, routing)
            .status());
  }
  LOOM_RETURN_IF_ERROR(flush());
  s.clip_fraction = static_cast<double>(clipped) * inv_n;
  return s;
}

}  // namespace loom
