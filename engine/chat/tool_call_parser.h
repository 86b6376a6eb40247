// Tool-call extraction from generated text, per chat format: one-shot (parse_tool_calls) and
// streaming (ToolCallStreamParser, fed text deltas). Both run the same state machine, so for any
// split of a text the accumulated stream equals the one-shot result. Output formats and the rules
// for malformed calls are in docs/chat.md.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/chat/chat_template.h"

namespace loom {

// What a generated text means: user-visible content plus the tool calls it made.
struct ParsedOutput {
  std::string content;
  std::vector<ToolCall> tool_calls;  // ids are the model's own (Kimi) or "call_<n>", n from 0
};

// One piece of a tool call. The first delta of call `index` carries its id and name (non-empty);
// later ones carry only argument fragments, to be concatenated.
struct ToolCallDelta {
  size_t index = 0;
  std::string id;
  std::string name;
  std::string arguments;
};

// What one feed() made unambiguous.
struct ChatDelta {
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return content.empty() && tool_calls.empty(); }
};

// Adds `delta` to `out` (content appended, calls created on their first delta, arguments
// appended).
void accumulate_delta(const ChatDelta& delta, ParsedOutput* out);

// Splits a complete generated text into content and tool calls. Never fails: text that does not
// form a valid call stays in content.
ParsedOutput parse_tool_calls(ChatFormat format, std::string_view text);

// Incremental parser for one generation. Not thread-safe; one per request.
class ToolCallStreamParser {
 public:
  explicit ToolCallStreamParser(ChatFormat format);
  ~ToolCallStreamParser();
  ToolCallStreamParser(const ToolCallStreamParser&) = delete;
  ToolCallStreamParser& operator=(const ToolCallStreamParser&) = delete;

  // Consumes the next piece of generated text; returns what became unambiguous. Text that may
  // still turn out to be part of a marker (e.g. a trailing "<tool_") is held back.
  ChatDelta feed(std::string_view text);
  // Ends the generation: flushes held-back text under end-of-text rules. Call once, last.
  ChatDelta finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom
