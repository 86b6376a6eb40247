// Tool-call extraction from generated text, per tool-call syntax: one-shot (parse_tool_calls) and
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

// How a model writes its tool calls. A checkpoint's own chat template decides which one its model
// uses (probe_tool_call_syntax, chat_template_probe.h); without one, its family's.
enum class ToolCallSyntax {
  // Kimi-K2: <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
  // <|tool_call_argument_begin|>ARGS<|tool_call_end|>...<|tool_calls_section_end|>
  kKimi,
  // DeepSeek-V3: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n
  // ARGS\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
  kDeepSeekV3,
  // DeepSeek-V3.1: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS
  // <｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
  kDeepSeekV31,
  // Qwen3 / Hermes: <tool_call>\n{"name": NAME, "arguments": ARGS}\n</tool_call>
  kQwen,
  // Loom's own: <|tool_call|>NAME<|tool_args|>ARGS<|tool_call_end|>
  kNative,
};

// Every syntax, in enum order.
inline constexpr ToolCallSyntax kToolCallSyntaxes[] = {
    ToolCallSyntax::kKimi, ToolCallSyntax::kDeepSeekV3, ToolCallSyntax::kDeepSeekV31,
    ToolCallSyntax::kQwen, ToolCallSyntax::kNative};

// "kimi", "deepseek_v3", "deepseek_v3.1", "qwen" or "native".
std::string_view tool_call_syntax_name(ToolCallSyntax syntax);

// The syntax of a family's built-in template: kimi -> kKimi, deepseek -> kDeepSeekV3, qwen ->
// kQwen, native -> kNative.
ToolCallSyntax default_tool_call_syntax(ChatFormat format);

// What a generated text means: reasoning, user-visible content and the tool calls it made.
struct ParsedOutput {
  std::string reasoning;  // the <think> block's text (reasoning_parser.h); empty when none
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
  std::string reasoning;  // only from ChatOutputParser (chat_output_parser.h)
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

// Adds `delta` to `out` (reasoning and content appended, calls created on their first delta,
// arguments appended).
void accumulate_delta(const ChatDelta& delta, ParsedOutput* out);

// Splits a complete generated text into content and tool calls. Never fails: text that does not
// form a valid call stays in content.
ParsedOutput parse_tool_calls(ToolCallSyntax syntax, std::string_view text);

// Incremental parser for one generation. Not thread-safe; one per request.
class ToolCallStreamParser {
 public:
  explicit ToolCallStreamParser(ToolCallSyntax syntax);
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
