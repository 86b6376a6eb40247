#include "trainer/rl/rollout.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "nlohmann/json.hpp"
#include "trainer/rl/routing_replay.h"
#include "trainer/tool_dialogues.h"

namespace loom {
namespace {

struct Episode {
  const EpisodeSpec* spec = nullptr;
  std::vector<ChatMessage> messages;
  std::vector<ToolDefinition> tools;
  Trajectory tr;
  bool done = false;
  std::shared_ptr<RequestStream> stream;
};

void append_context(Trajectory& tr, std::span<const int32_t> ids) {
  for (int32_t id : ids) {
    tr.tokens.push_back(id);
    tr.sampled.push_back(0);
    tr.behav_logp.push_back(0.0f);
  }
}

// The model's turn: what it sampled, then what the environment makes of it. Appends the next
// prompt's context tokens when the episode goes on.
absl::Status finish_turn(const Tokenizer& tokenizer, const ChatSetup& chat,
                         const RolloutOptions& options, const std::vector<int32_t>& ids,
                         const std::vector<float>& logprobs, FinishReason finish, Episode& e) {
  Trajectory& tr = e.tr;
  for (size_t j = 0; j < ids.size(); ++j) {
    tr.sampled.back() = 1;
    tr.behav_logp.back() = logprobs[j];
    append_context(tr, std::span<const int32_t>(&ids[j], 1));
  }
  tr.response_tokens += static_cast<int64_t>(ids.size());
  ++tr.turns;
  // A trailing special token (EOS) is not text of the reply; the marker may be special itself.
  size_t text_ids = ids.size();
  if (finish == FinishReason::kStop && text_ids > 0 && tokenizer.is_special(ids.back()) &&
      (chat.end_of_turn_id < 0 || ids.back() != chat.end_of_turn_id))
    --text_ids;
  LOOM_ASSIGN_OR_RETURN(std::string text,
                        tokenizer.decode(std::span<const int32_t>(ids.data(), text_ids)));
  const size_t marker = text.find(chat.end_of_turn);
  if (marker == std::string::npos && finish == FinishReason::kLength) {
    e.done = tr.truncated = true;  // cut mid-turn: nothing to hand the environment
    return absl::OkStatus();
  }
  const ParsedOutput parsed =
      parse_tool_calls(chat.syntax, std::string_view(text).substr(0, marker));
  // A call without a name or whose arguments are not JSON cannot be rendered back into the
  // conversation (the chat template's validation refuses it): the episode ends there, unrewarded.
  for (const ToolCall& call : parsed.tool_calls)
    if (call.name.empty() || !nlohmann::json::accept(call.arguments_json)) {
      e.done = tr.malformed = true;
      return absl::OkStatus();
    }
  ChatMessage reply{
      .role = "assistant", .content = parsed.content, .tool_calls = parsed.tool_calls};
  const EnvStep step = e.spec->env->step(reply);
  tr.task_reward = e.spec->env->reward();
  if (step.done) {
    e.done = tr.answered = true;
    return absl::OkStatus();
  }
  // Tool calls, but the model ended the text (EOS) or the turn budget is spent.
  if (marker == std::string::npos || tr.turns >= options.max_turns) {
    e.done = tr.truncated = true;
    return absl::OkStatus();
  }
  e.messages.push_back(std::move(reply));
  LOOM_ASSIGN_OR_RETURN(
      const std::string with_reply,
      render_chat(chat.format, e.messages, e.tools, {.add_generation_prompt = false}));
  for (const ChatMessage& m : step.messages) e.messages.push_back(m);
  LOOM_ASSIGN_OR_RETURN(
      const RenderedChat next,
      render_chat_prompt(chat.format, e.messages, e.tools, {.add_generation_prompt = true}));
  const std::string end = chat.end_of_turn + chat.after_end;
  if (!next.text.starts_with(with_reply) || !with_reply.ends_with(end))
    return absl::InvalidArgumentError(absl::StrCat(
        "rollout: the ", absl_sv(chat_format_name(chat.format)),
        " template does not render the conversation incrementally after a tool result"));
  // The model wrote through the marker; the template's text after it is the context.
  const size_t begin = with_reply.size() - chat.after_end.size();
  const std::vector<int32_t> context = tokenizer.encode_with_special_ranges(
      std::string_view(next.text).substr(begin),
      clip_ranges(next.markup_ranges, begin, next.text.size()));
  append_context(tr, context);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ChatSetup> chat_setup_for(ChatFormat format, const Tokenizer& tokenizer) {
  ChatSetup s;
  s.format = format;
  s.syntax = default_tool_call_syntax(format);
  LOOM_ASSIGN_OR_RETURN(s.end_of_turn, end_of_turn_marker(format));
  const std::vector<ChatMessage> q = {{.role = "user", .content = "q"}};
  LOOM_ASSIGN_OR_RETURN(const std::string prompt,
                        render_chat(format, q, {}, {.add_generation_prompt = true}));
  std::vector<ChatMessage> qa = q;
  qa.push_back({.role = "assistant", .content = "a"});
  LOOM_ASSIGN_OR_RETURN(const std::string whole,
                        render_chat(format, qa, {}, {.add_generation_prompt = false}));
  const std::string after = whole.substr(prompt.size() + 1);
  const size_t at = after.find(s.end_of_turn);
  if (at == std::string::npos)
    return absl::InvalidArgumentError("rollout: no end-of-turn marker after a reply");
  s.after_end = after.substr(at + s.end_of_turn.size());
  const Tokenizer::Range all{0, s.end_of_turn.size()};
  const std::vector<int32_t> ids =
      tokenizer.encode_with_special_ranges(s.end_of_turn, std::span(&all, 1));
  if (ids.size() == 1 && tokenizer.is_special(ids[0])) s.end_of_turn_id = ids[0];
  return s;
}

absl::Status RolloutOptions::validate() const {
  if (max_turns < 1 || max_turns > 64)
    return absl::InvalidArgumentError(
        absl::StrCat("rollout.max_turns: ", max_turns, " outside [1, 64]"));
  if (max_turn_tokens < 1 || max_turn_tokens > (1 << 20))
    return absl::InvalidArgumentError(
        absl::StrCat("rollout.max_turn_tokens: ", max_turn_tokens, " outside [1, 2^20]"));
  if (max_trajectory_tokens < 2 || max_trajectory_tokens > (int64_t{1} << 24))
    return absl::InvalidArgumentError(absl::StrCat(
        "rollout.max_trajectory_tokens: ", max_trajectory_tokens, " outside [2, 2^24]"));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Trajectory>> run_rollouts(Engine& engine, const Tokenizer& tokenizer,
                                                     const ChatSetup& chat,
                                                     const std::vector<EpisodeSpec>& episodes,
                                                     const RolloutOptions& options) {
  LOOM_RETURN_IF_ERROR(options.validate());
  std::vector<Episode> live(episodes.size());
  int moe_layers = 0;
  for (FfnType f : engine.config().ffns) moe_layers += f == FfnType::kMoe;
  if (options.record_routing && moe_layers == 0)
    return absl::InvalidArgumentError(
        "rollout: record_routing (routing replay) needs a model with MoE layers");
  for (size_t i = 0; i < episodes.size(); ++i) {
    Episode& e = live[i];
    e.spec = &episodes[i];
    if (options.record_routing) {
      e.tr.routed_layers = moe_layers;
      e.tr.routed_top_k = engine.config().moe.top_k;
    }
    if (e.spec->env == nullptr)
      return absl::InvalidArgumentError("rollout: an episode without env");
    EnvReset start = e.spec->env->reset(e.spec->env_seed);
    e.messages = std::move(start.messages);
    e.tools = std::move(start.tools);
    LOOM_ASSIGN_OR_RETURN(
        const RenderedChat prompt,
        render_chat_prompt(chat.format, e.messages, e.tools, {.add_generation_prompt = true}));
    append_context(e.tr, encode_chat_prompt(tokenizer, prompt));
    if (static_cast<int64_t>(e.tr.tokens.size()) >= options.max_trajectory_tokens)
      return absl::InvalidArgumentError(
          absl::StrCat("rollout: a first prompt of ", e.tr.tokens.size(),
                       " tokens leaves nothing of rollout.max_trajectory_tokens ",
                       options.max_trajectory_tokens));
  }
  auto cancel_all = [&] {
    for (Episode& e : live)
      if (e.stream) engine.cancel(e.stream->id());
  };
  for (bool any = true; any;) {
    any = false;
    for (Episode& e : live) {
      e.stream.reset();
      if (e.done) continue;
      int64_t budget = options.max_trajectory_tokens - static_cast<int64_t>(e.tr.tokens.size());
      if (engine.max_model_len() > 0)
        budget = std::min<int64_t>(
            budget, engine.max_model_len() - static_cast<int64_t>(e.tr.tokens.size()));
      if (budget < 1) {
        e.done = e.tr.truncated = true;
        continue;
      }
      Request r;
      r.prompt = e.tr.tokens;
      r.params.temperature = 1.0f;
      r.params.max_tokens = static_cast<int>(std::min<int64_t>(options.max_turn_tokens, budget));
      r.params.logprobs = 0;
      r.params.seed = e.spec->sample_seed + static_cast<uint64_t>(e.tr.turns);
      r.params.stop = {chat.end_of_turn};
      if (chat.end_of_turn_id >= 0) r.params.stop_token_ids = {chat.end_of_turn_id};
      r.tag = "rl-rollout";
      r.return_routed_experts = options.record_routing;
      auto stream = engine.submit(std::move(r));
      if (!stream.ok()) {
        cancel_all();
        return stream.status();
      }
      e.stream = std::move(stream).value();
      any = true;
    }
    for (Episode& e : live) {
      if (!e.stream) continue;
      std::vector<int32_t> ids;
      std::vector<float> logprobs;
      FinishReason finish = FinishReason::kNone;
      const bool first_turn = e.tr.turns == 0;
      while (std::optional<RequestOutput> ev = e.stream->next()) {
        // Every turn of an episode must come from one policy: the trainer scores the whole
        // trajectory against the behaviour logprobs of a single weight version.
        if (first_turn && ids.empty()) e.tr.version = ev->weight_version;
        if (ev->weight_version != e.tr.version) {
          cancel_all();
          return absl::FailedPreconditionError(
              absl::StrCat("rollout: the engine's weights changed mid-episode (version ",
                           e.tr.version, " then ", ev->weight_version, ")"));
        }
        if (absl::Status st = add_routed_experts(ev->routed_experts, e.tr); !st.ok()) {
          cancel_all();
          return st;
        }
        ids.insert(ids.end(), ev->token_ids.begin(), ev->token_ids.end());
        for (const TokenLogprob& lp : ev->logprobs) logprobs.push_back(lp.logprob);
        if (ev->finish) finish = *ev->finish;
        if (finish == FinishReason::kError || finish == FinishReason::kCancelled) {
          cancel_all();
          return absl::InternalError(absl::StrCat("rollout: the engine ended a turn with ",
                                                  absl_sv(finish_reason_name(finish)), ": ",
                                                  ev->error));
        }
      }
      if (logprobs.size() != ids.size()) {
        cancel_all();
        return absl::InternalError("rollout: the engine returned tokens without logprobs");
      }
      if (absl::Status st = finish_turn(tokenizer, chat, options, ids, logprobs, finish, e);
          !st.ok()) {
        cancel_all();
        return st;
      }
    }
  }
  std::vector<Trajectory> out;
  out.reserve(live.size());
  for (Episode& e : live) out.push_back(std::move(e.tr));
  if (options.record_routing) fill_shared_prefix_routing(out);
  return out;
}

}  // namespace loom
