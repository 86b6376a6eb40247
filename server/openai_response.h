// OpenAiResponseBuilder: turns one request's engine events into OpenAI response bodies, either
// one JSON object (non-streaming) or a sequence of chunk objects (streaming; the SSE framing is
// sse_writer's). Chat replies are read with the chat module's parsers (reasoning split off, tool
// calls extracted): ChatOutputParser when streaming, parse_chat_output otherwise (the same state
// machines, so both paths agree).
// Not thread-safe: one per request, used by one strand.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/chat/chat_output_parser.h"
#include "engine/request.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/response_renderer.h"

namespace loom {

struct ResponseContext {
  bool chat = false;
  bool stream = false;
  bool include_usage = false;  // streaming: a last chunk with usage and no choices
  bool logprobs = false;
  // Chat: how replies are read (reasoning split off; tool calls parsed when the request has tools
  // and tool_choice "auto"). Neither: the text is the content.
  ChatOutputOptions output;
  std::string id;  // "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;
  std::string model;
  int num_prompts = 1;                   // engine requests (completions with a list of prompts)
  int n = 1;                             // choices per prompt
  const Tokenizer* tokenizer = nullptr;  // for logprob token strings; must outlive the builder
};

class OpenAiResponseBuilder : public ResponseRenderer {
 public:
  explicit OpenAiResponseBuilder(ResponseContext ctx);
  ~OpenAiResponseBuilder() override;

  // Consumes one event of prompt `prompt`'s engine request. Streaming: returns the chunk objects
  // (JSON text) it produces, in order; non-streaming: accumulates and returns nothing.
  std::vector<std::string> on_event(int prompt, const RequestOutput& out) override;
  // Streaming, after every choice finished: the usage chunk when asked for (else nothing).
  std::vector<std::string> stream_tail() const override;
  // Non-streaming, after every choice finished: the response object.
  std::string final_json() const override;

  bool done() const { return finished_ == static_cast<int>(choices_.size()); }
  // The first engine error of any choice (empty if none): the caller answers 500.
  const std::string& error() const override { return error_; }
  int prompt_tokens() const override;
  int completion_tokens() const override;
  // Finish reason of the last choice to finish ("stop", "length", "tool_calls", "abort", "error").
  const std::string& last_finish_reason() const override { return last_reason_; }

 private:
  struct Choice;  // per-choice text, tokens, logprobs, stream parser (defined in the .cc)

  std::vector<std::string> stream_event(Choice& c, int index, const RequestOutput& out);
  // Chat whose replies are parsed rather than passed through as content.
  bool reads_output() const {
    return ctx_.chat && (ctx_.output.reasoning || ctx_.output.tool_calls.has_value());
  }

  ResponseContext ctx_;
  std::vector<std::unique_ptr<Choice>> choices_;  // prompt-major: prompt * n + out.index
  std::vector<int> prompt_tokens_;                // per prompt, from final events
  int finished_ = 0;
  std::string error_;
  std::string last_reason_;
};

}  // namespace loom
