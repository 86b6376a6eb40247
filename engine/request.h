// Request and output types of the Engine API. Plain values; no threading here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/sampling/sampling_params.h"

namespace loom {

struct Request {
  std::vector<int32_t> prompt;  // token ids, non-empty, each in [0, vocab)
  SamplingParams params;
  int32_t priority = 0;  // higher first; FCFS within a priority
  std::string tag;       // free text for logs (e.g. the HTTP request id)
  // Non-empty: a turn of this session (engine/session_store.h). `prompt` holds only the turn's new
  // tokens; the engine prepends the session's history and continues from the state it kept at
  // the end of the previous turn. The first turn creates the session. Requires n == 1.
  std::string session;
  // A session turn whose `prompt` is the whole conversation rather than its new tokens (the
  // Responses API renders the whole conversation through the chat template): when the session's
  // history is a proper prefix of it, the turn continues the session with the rest; otherwise the
  // session starts over from `prompt` (its kept cache dropped), so the tokens the model sees are
  // `prompt` either way. Checked atomically with the turn's start.
  bool session_whole_prompt = false;
  // Routing replay for MoE RL (issue 20; engine/model/routing_replay.h): report the experts every
  // MoE layer routed each position this request computes to (RequestOutput::routed_experts). Off
  // (the default), the serving path records nothing. InvalidArgument for a model without MoE
  // layers.
  bool return_routed_experts = false;
};

// Why a choice ended. kStop: EOS, a stop token or a stop string; kLength: max_tokens; kCancelled:
// Engine::cancel or shutdown; kError: the engine failed it (a bad step, a rejected admission).
enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };

// The OpenAI finish_reason of `reason`: "stop", "length", "abort" (cancelled, as vLLM says it),
// "error"; empty for kNone (not finished).
constexpr std::string_view finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "abort";
    case FinishReason::kError:
      return "error";
    case FinishReason::kNone:
      break;
  }
  return "";
}

// The experts the engine routed consecutive positions of a choice's sequence to
// (Request::return_routed_experts).
struct RoutedExperts {
  int64_t first_position = 0;  // the sequence position of the first row
  int64_t rows = 0;
  // [rows, moe_layers, top_k]: the model's MoE layers in layer order, each row's experts in the
  // router's order (descending selection score).
  std::vector<int32_t> expert_ids;
};

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // descending
};

// One event of a request's output stream. Events of different choices (n > 1) interleave; each
// choice ends with exactly one event whose `finish` is set.
struct RequestOutput {
  int32_t index = 0;                   // choice index in [0, n)
  std::vector<int32_t> token_ids;      // tokens sampled since the choice's previous event
  std::string text;                    // their text: whole UTF-8 characters, stop strings withheld
  std::vector<TokenLogprob> logprobs;  // one per token when logprobs >= 0
  std::optional<FinishReason> finish;  // stop, length, cancelled or error: the choice's last event
  std::string error;                   // when finish == kError
  // Usage, on the final event of each choice.
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  // Prompt tokens served from a cache instead of computed (usage's cached_tokens), as found when
  // the choice was first scheduled. A session turn counts the history it continues: all of it
  // when the session's kept cache (parked, or offloaded and copied back) was used (the history's
  // last token, sampled but never fed, included), else the part the prefix cache held; any other
  // request, its prefix-cache hit.
  int32_t cached_tokens = 0;
  // The engine's weight version (Engine::update_weights) the request was sampled under, on every
  // event: a request is never sampled across an update.
  int64_t weight_version = 0;
  // With Request::return_routed_experts: the positions the choice's forwards computed since its
  // previous event (prompt rows, then each sampled token as it is fed back), in runs of
  // consecutive positions. Positions served from the prefix cache (or, for n > 1, from choice 0's
  // prefill) were computed by an earlier request and are not here; a preempted sequence's
  // recomputed positions come again.
  std::vector<RoutedExperts> routed_experts;
};

}  // namespace loom
