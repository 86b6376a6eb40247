// The OpenAI request bodies loom-cli and loom-bench send, and the reading of the chunks a streamed
// reply is made of. Only what these tools use: one choice (n = 1), text content.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace loom::client {

// Sampling and length settings; unset fields are left out of the request (server defaults).
struct GenerationParams {
  std::string model;  // empty: left out (the server serves one model)
  std::optional<int64_t> max_tokens;
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int64_t> top_k;  // Loom extension
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool ignore_eos = false;  // Loom extension: benchmarks generate exactly max_tokens
  // Each token's logprob (completions: "logprobs": 0; chat: "logprobs": true). Streamed, every
  // token then arrives in a chunk even where it decodes to no text yet.
  bool logprobs = false;
};

struct ChatMessage {
  std::string role;  // system, user, assistant
  std::string content;
};

// POST /v1/completions; `prompt` is a string or an array of token ids.
nlohmann::json completion_request(const GenerationParams& params, nlohmann::json prompt,
                                  bool stream);
// POST /v1/chat/completions.
nlohmann::json chat_request(const GenerationParams& params,
                            const std::vector<ChatMessage>& messages, bool stream);

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

// What one `data:` payload of a completions or chat stream says about choice 0.
struct StreamChunk {
  bool done = false;          // the `[DONE]` sentinel
  std::string text;           // text (completions) or delta.content (chat) of choice 0
  std::string finish_reason;  // set on the choice's last chunk
  // Tokens of choice 0's logprobs in this chunk (completions: logprobs.tokens; chat:
  // logprobs.content); 0 when the request did not ask for logprobs.
  int64_t logprob_tokens = 0;
  std::optional<Usage> usage;  // the usage chunk (stream_options.include_usage)
};

// Parses one payload. An `{"error": ...}` payload (the server failed mid-stream) or malformed JSON
// is an error carrying the message.
absl::StatusOr<StreamChunk> parse_stream_chunk(std::string_view data, bool chat);

// Reads a non-streamed reply: choice 0's text (or message content), finish reason and usage.
struct Completion {
  std::string text;
  std::string finish_reason;
  Usage usage;
};
absl::StatusOr<Completion> parse_completion(std::string_view body, bool chat);

}  // namespace loom::client
