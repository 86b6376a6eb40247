// Parsing of OpenAI /v1/completions and /v1/chat/completions bodies into an OpenAiRequest, and
// its translation into engine Requests (chat template + tokenizer). Pure functions, thread-safe.
// Errors are InvalidArgument with messages "param: what is wrong" (see openai_error.h).
// Supported fields and what is rejected are listed in docs/api.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/chat/chat_template.h"
#include "engine/chat/checkpoint_chat_template.h"
#include "engine/request.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/chat_history.h"

namespace loom {

// One completions prompt: text, or token ids.
struct PromptInput {
  bool is_text = true;
  std::string text;
  std::vector<int32_t> ids;
};

enum class ToolChoice { kNone, kAuto };

struct OpenAiRequest {
  bool chat = false;
  std::string model;  // empty: the served model
  // Completions: one or more prompts (choices are prompt-major: prompt p, sample i -> p * n + i).
  std::vector<PromptInput> prompts;
  // Chat.
  std::vector<ChatMessage> messages;
  std::vector<ToolDefinition> tools;
  ToolChoice tool_choice = ToolChoice::kAuto;
  // The same messages and tools as the request wrote them (key order kept; assistant messages may
  // carry `reasoning_content`, which only these reach), for a checkpoint's own Jinja template, and
  // its switches (`chat_template_kwargs`, vLLM's name; an object or null).
  nlohmann::ordered_json template_messages, template_tools, chat_template_kwargs;
  // Sampling; params.max_tokens is set from max_tokens below by build_engine_requests.
  SamplingParams params;
  std::optional<int> max_tokens;  // unset: 16 (completions) or the context left (chat)
  int32_t priority = 0;
  // Whether special-token spellings in text the request brings are tokenized as special tokens
  // (`parse_special_tokens`, a Loom extension). Default: true for completions prompts (raw text,
  // as vLLM does, so client-rendered templates work), false for chat messages (only the chat
  // template places special tokens).
  bool parse_special_tokens = true;
  // Output.
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;       // params.logprobs >= 0
  int top_logprobs = 0;        // params.logprobs when logprobs
  // Whether tool calls are parsed out of the output.
  bool parse_tools() const { return chat && !tools.empty() && tool_choice == ToolChoice::kAuto; }
};

// Largest number of prompts in one completions request, and of prompts x n.
inline constexpr int kMaxPrompts = 64;
inline constexpr int kMaxChoices = 64;
// Chat requests without max_tokens get the context left, capped here.
inline constexpr int kDefaultChatMaxTokens = 4096;

// Nesting deeper than this is rejected before parsing: nlohmann's dump() recurses.
inline constexpr int kMaxJsonDepth = 64;
// Fails (InvalidArgument) when brackets outside strings nest deeper than kMaxJsonDepth.
absl::Status check_json_depth(std::string_view body);

absl::StatusOr<OpenAiRequest> parse_completion_request(std::string_view body);
// A kept conversation's turn (server/chat_session.h) passes its `history`: the result is what
// parsing `body` with history's messages inserted before its message `history_at` would give
// (the same messages, errors naming the same messages[i]), without serializing or parsing them
// again. REQUIRES: history_at <= the body's message count when the body has a messages list.
absl::StatusOr<OpenAiRequest> parse_chat_request(std::string_view body,
                                                 const ChatHistory* history = nullptr,
                                                 size_t history_at = 0);
// One message of a chat request's `messages`, checked and converted as parse_chat_request does
// (`param` names it in errors, e.g. "messages[3]"): how a reply joins a kept conversation.
absl::StatusOr<ChatMessage> parse_chat_message(const nlohmann::ordered_json& message,
                                               const std::string& param);

// build_engine_requests' chat steps, for a caller that encodes only part of the prompt (a kept
// conversation's next turn, server/conversation_tokens.h):
// The chat request's prompt rendered (errors and `opens_reasoning` as build_engine_requests).
absl::StatusOr<RenderedChat> render_chat_request(const OpenAiRequest& req, ChatFormat format,
                                                 const CheckpointChatTemplate* chat_template,
                                                 bool* opens_reasoning = nullptr);
// rendered.text from byte `begin` on, encoded as build_engine_requests encodes a chat prompt:
// special tokens matched everywhere with req.parse_special_tokens, else only inside the
// template's markup ranges. REQUIRES: begin <= rendered.text.size().
std::vector<int32_t> encode_chat_text(const OpenAiRequest& req, const Tokenizer& tokenizer,
                                      const RenderedChat& rendered, size_t begin = 0);
// The engine request of prompt `ids` with `req`'s sampling (max_tokens defaulted as
// build_engine_requests does). InvalidArgument for an empty prompt.
absl::StatusOr<Request> engine_request(const OpenAiRequest& req, std::vector<int32_t> ids,
                                       int32_t max_model_len);

// The engine requests of `req`, one per prompt (one for chat), tokenized as
// `req.parse_special_tokens` says (chat: special tokens of the template always count).
// `max_model_len` (0: unlimited) sets chat's default max_tokens; the engine still checks prompt +
// max_tokens against it. InvalidArgument on render errors or an empty prompt.
// Chat renders with `chat_template` (the checkpoint's own) when given, else with `format`'s
// built-in template, which takes no chat_template_kwargs. `opens_reasoning`, when given, is set to
// whether the rendered chat prompt leaves the model inside a reasoning block
// (prompt_opens_reasoning, engine/chat/reasoning_parser.h); false for completions.
absl::StatusOr<std::vector<Request>> build_engine_requests(
    const OpenAiRequest& req, const Tokenizer& tokenizer, ChatFormat format, int32_t max_model_len,
    const CheckpointChatTemplate* chat_template = nullptr, bool* opens_reasoning = nullptr);

}  // namespace loom
