#include "engine/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace loom {

namespace {

absl::Status bad(const char* field, auto v, const std::string& expected) {
  return absl::InvalidArgumentError(absl::StrCat(field, " = ", v, ": expected ", expected));
}

}  // namespace

absl::Status SamplingParams::validate_ranges() const {
  if (!(temperature >= 0.0f && temperature <= kMaxTemperature))
    return bad("temperature", temperature, absl::StrCat("[0, ", kMaxTemperature, "]"));
  if (top_k < 0) return bad("top_k", top_k, ">= 0 (0 disables it)");
  if (!(top_p > 0.0f && top_p <= 1.0f)) return bad("top_p", top_p, "(0, 1]");
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return bad("min_p", min_p, "[0, 1]");
  if (!(repetition_penalty > 0.0f) || repetition_penalty > 100.0f)
    return bad("repetition_penalty", repetition_penalty, "(0, 100]");
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f))
    return bad("presence_penalty", presence_penalty, "[-2, 2]");
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f))
    return bad("frequency_penalty", frequency_penalty, "[-2, 2]");
  return absl::OkStatus();
}

absl::Status SamplingParams::validate(int vocab_size) const {
  if (absl::Status st = validate_ranges(); !st.ok()) return st;
  if (max_tokens < 1) return bad("max_tokens", max_tokens, ">= 1");
  if (min_tokens < 0 || min_tokens > max_tokens)
    return bad("min_tokens", min_tokens, "between 0 and max_tokens");
  if (logprobs < -1 || logprobs > kMaxLogprobs)
    return bad("logprobs", logprobs, absl::StrCat("-1 (none) to ", kMaxLogprobs));
  if (n < 1 || n > kMaxN) return bad("n", n, absl::StrCat("1 to ", kMaxN));
  for (int32_t t : stop_token_ids)
    if (t < 0 || t >= vocab_size)
      return bad("stop_token_ids", t, absl::StrCat("token ids in [0, ", vocab_size, ")"));
  if (logit_bias.size() > static_cast<size_t>(kMaxLogitBias))
    return bad("logit_bias", logit_bias.size(),
               absl::StrCat("at most ", kMaxLogitBias, " entries"));
  for (const auto& [t, b] : logit_bias) {
    if (t < 0 || t >= vocab_size)
      return bad("logit_bias", t, absl::StrCat("token ids in [0, ", vocab_size, ")"));
    if (!(b >= -kMaxLogitBiasValue && b <= kMaxLogitBiasValue))
      return bad("logit_bias", b, "biases in [-100, 100]");
  }
  if (stop.size() > static_cast<size_t>(kMaxStopStrings))
    return bad("stop", stop.size(), absl::StrCat("at most ", kMaxStopStrings, " strings"));
  for (const std::string& s : stop)
    if (s.empty() || s.size() > static_cast<size_t>(kMaxStopStringBytes))
      return bad("stop", s.size(), absl::StrCat("strings of 1 to ", kMaxStopStringBytes, " bytes"));
  return absl::OkStatus();
}

float presence_frequency_penalty(const SamplingParams& p, int32_t count) {
  return p.presence_penalty + p.frequency_penalty * static_cast<float>(count);
}

SamplerState::SamplerState(uint64_t seed, std::span<const int32_t> prompt) : rng_(seed) {
  for (int32_t t : prompt) prompt_tokens_[t] = true;
}

double SamplerState::next_uniform() {
  return std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
}

void SamplerState::record(int32_t token) {
  ++output_counts_[token];
  ++num_generated_;
}

namespace {

// log-softmax of `logits` at `token`, and the top-k (raw logits, before any processing).
void fill_logprobs(std::span<const float> logits, int k, SampledToken& out) {
  const float mx = *std::max_element(logits.begin(), logits.end());
  double z = 0.0;
  for (float l : logits) z += std::exp(static_cast<double>(l) - mx);
  const float log_z = mx + static_cast<float>(std::log(z));
  out.logprob = logits[out.token] - log_z;
  if (k <= 0) return;
  std::vector<int32_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  const size_t kk = std::min<size_t>(k, idx.size());
  std::partial_sort(idx.begin(), idx.begin() + kk, idx.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  for (size_t i = 0; i < kk; ++i) out.top_logprobs.emplace_back(idx[i], logits[idx[i]] - log_z);
}

}  // namespace

SampledToken SamplerState::sample(std::span<float> logits, const SamplingParams& p,
                                  std::span<const int32_t> eos_ids) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  SampledToken out;
  // Raw logprobs are taken before any processing (as vLLM reports them by default); copy only
  // when asked for, since the processing below works in place.
  std::vector<float> raw;
  if (p.logprobs >= 0) raw.assign(logits.begin(), logits.end());

  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (const auto& [t, b] : p.logit_bias) logits[t] += b;
  // Penalties.
  if (p.repetition_penalty != 1.0f) {
    auto penalise = [&](int32_t t) {
      float& l = logits[t];
      l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    };
    for (const auto& [t, _] : prompt_tokens_) penalise(t);
    for (const auto& [t, _] : output_counts_)
      if (!prompt_tokens_.contains(t)) penalise(t);
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    for (const auto& [t, count] : output_counts_) logits[t] -= presence_frequency_penalty(p, count);
  }
  // min_tokens: no EOS or stop token yet.
  if (num_generated_ < p.min_tokens) {
    for (int32_t t : eos_ids) logits[t] = kNegInf;
    for (int32_t t : p.stop_token_ids) logits[t] = kNegInf;
  }

  if (p.temperature == 0.0f) {
    out.token =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  } else {
    // Candidates sorted by logit (descending, ties by id), then filtered.
    std::vector<int32_t> idx(vocab);
    std::iota(idx.begin(), idx.end(), 0);
    auto by_logit = [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    };
    int64_t keep = vocab;
    if (p.top_k > 0 && p.top_k < vocab) {
      keep = p.top_k;
      std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(), by_logit);
    } else {
      std::sort(idx.begin(), idx.end(), by_logit);
    }
    const float mx = logits[idx[0]];
    std::vector<double> prob(keep);
    double z = 0.0;
    for (int64_t i = 0; i < keep; ++i) {
      prob[i] = std::exp((static_cast<double>(logits[idx[i]]) - mx) / p.temperature);
      z += prob[i];
    }
    for (double& q : prob) q /= z;
    if (p.top_p < 1.0f) {
      double cum = 0.0;
      int64_t cut = keep;
      for (int64_t i = 0; i < keep; ++i) {
        cum += prob[i];
        if (cum >= p.top_p) {
          cut = i + 1;
          break;
        }
      }
      keep = cut;
    }
    if (p.min_p > 0.0f) {
      const double threshold = p.min_p * prob[0];
      int64_t cut = 1;
      while (cut < keep && prob[cut] >= threshold) ++cut;
      keep = cut;
    }
    double total = 0.0;
    for (int64_t i = 0; i < keep; ++i) total += prob[i];
    // One uniform draw per token keeps the stream aligned whatever the filters did.
    const double u = next_uniform() * total;
    double cum = 0.0;
    out.token = idx[keep - 1];
    for (int64_t i = 0; i < keep; ++i) {
      cum += prob[i];
      if (u < cum) {
        out.token = idx[i];
        break;
      }
    }
  }
  if (p.temperature == 0.0f) next_uniform();
  if (p.logprobs >= 0) fill_logprobs(raw, p.logprobs, out);
  record(out.token);
  return out;
}

}  // namespace loom
