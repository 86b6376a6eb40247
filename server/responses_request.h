// Parsing of OpenAI Responses API bodies (POST /v1/responses) into the chat request every
// frontend already serves. A Responses request is translated, not reinterpreted: its input items
// become chat messages, its function tools chat tools, max_output_tokens max_tokens, and the
// result is handed to parse_chat_request (server/openai_request.h), so the chat template, the
// tool-call parser and every validation and limit are the chat path's. Only what the Responses
// API has and chat has not (previous_response_id, store, instructions) is handled here.
// Pure functions, thread-safe. Errors are InvalidArgument "param: what is wrong" (openai_error.h).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace loom {

struct ResponsesRequest {
  std::optional<std::string> previous_response_id;
  bool store = true;  // OpenAI's default: the response can be retrieved and continued
  bool stream = false;
  // The request's input as chat messages (ordered as written), without the instructions: what
  // a stored response keeps of the turn, with its reply appended.
  nlohmann::ordered_json input_messages = nlohmann::ordered_json::array();
  // `instructions`: a system message placed first; not carried over to the next turn (OpenAI's
  // rule: a continuation sends its own).
  std::optional<std::string> instructions;
  // The chat body's other fields (model, tools, tool_choice, sampling, max_tokens, ...), without
  // messages and stream.
  nlohmann::ordered_json chat_fields = nlohmann::ordered_json::object();
  // Echoed in the response object as OpenAI does.
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();  // the Responses shape
  std::string tool_choice = "auto";
  std::optional<double> temperature, top_p;
  std::optional<int64_t> max_output_tokens;
  nlohmann::ordered_json metadata = nlohmann::ordered_json::object();
};

// Checks the Responses-specific fields and translates the rest. Unsupported parameters (built-in
// tools, background, reasoning, non-text formats, truncation "auto", ...) are refused by name.
absl::StatusOr<ResponsesRequest> parse_responses_request(std::string_view body);

// The /v1/chat/completions body of a turn: instructions, then `history` (the stored messages of
// the previous responses, oldest first), then the request's input. Stream is left off: the
// Responses route streams its own events.
std::string responses_chat_body(const ResponsesRequest& req, const nlohmann::ordered_json& history);

}  // namespace loom
