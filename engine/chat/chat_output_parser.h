// A generation's text read as an OpenAI chat reply: reasoning split off its start
// (reasoning_parser.h), then tool calls parsed out of the rest (tool_call_parser.h). Streaming
// (ChatOutputParser) and one-shot (parse_chat_output) chain the same two state machines, so any
// split of a text accumulates to the one-shot result.
#pragma once

#include <optional>
#include <string_view>

#include "engine/chat/reasoning_parser.h"
#include "engine/chat/tool_call_parser.h"

namespace loom {

// How one request's generation is read.
struct ChatOutputOptions {
  // Split a leading reasoning block off as ParsedOutput::reasoning.
  bool reasoning = false;
  // With `reasoning`: the prompt opened the block (prompt_opens_reasoning).
  bool starts_in_reasoning = false;
  // Parse tool calls written in this syntax out of the text after the reasoning; none: all of
  // that text is content.
  std::optional<ToolCallSyntax> tool_calls;
};

// Incremental reader of one generation. Not thread-safe; one per request.
class ChatOutputParser {
 public:
  explicit ChatOutputParser(const ChatOutputOptions& options);

  // Consumes the next piece of generated text; returns what became unambiguous.
  ChatDelta feed(std::string_view text);
  // Ends the generation (flushes what was held back). Call once, last.
  ChatDelta finish();

 private:
  ChatDelta answer(const ReasoningSplit& split, bool eof);

  std::optional<ReasoningStreamParser> reasoning_;
  std::optional<ToolCallStreamParser> tool_calls_;
};

// Reads a complete generated text.
ParsedOutput parse_chat_output(const ChatOutputOptions& options, std::string_view text);

}  // namespace loom
