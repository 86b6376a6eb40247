// libFuzzer target: generated text through the tool-call parsers. The input picks a tool-call
// syntax, a split pattern and the text; bytes 0x01..0x0f in the text expand to its markers and
// JSON fragments so the fuzzer reaches the call states. Asserts that the streaming parser fed the
// split text accumulates exactly the one-shot parse, and that nothing crashes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "engine/chat/tool_call_parser.h"

namespace {

const std::vector<std::string_view>& pieces(loom::ToolCallSyntax f) {
  static const std::vector<std::string_view> kimi = {"<|tool_calls_section_begin|>",
                                                     "<|tool_calls_section_end|>",
                                                     "<|tool_call_begin|>",
                                                     "<|tool_call_argument_begin|>",
                                                     "<|tool_call_end|>",
                                                     "functions.get_weather:0",
                                                     "{\"a\": \"b\"}",
                                                     "<|tool_",
                                                     " ",
                                                     "\n",
                                                     ":1",
                                                     "<|im_end|>",
                                                     "functions.",
                                                     "\"",
                                                     "}"};
  static const std::vector<std::string_view> deepseek = {"<｜tool▁calls▁begin｜>",
                                                         "<｜tool▁calls▁end｜>",
                                                         "<｜tool▁call▁begin｜>",
                                                         "<｜tool▁sep｜>",
                                                         "<｜tool▁call▁end｜>",
                                                         "function",
                                                         "\n```json\n",
                                                         "\n```",
                                                         "{\"a\": 1}",
                                                         "<｜tool",
                                                         "\n",
                                                         "get_weather",
                                                         "`",
                                                         "｜",
                                                         "\""};
  static const std::vector<std::string_view> qwen = {"<tool_call>",
                                                     "</tool_call>",
                                                     "{\"name\": \"f\", \"arguments\": ",
                                                     "{\"a\": [1, \"}\"]}",
                                                     "}",
                                                     "{",
                                                     "\"",
                                                     "\\",
                                                     "\n",
                                                     "<tool_",
                                                     "\"name\"",
                                                     "\"arguments\"",
                                                     ":",
                                                     ",",
                                                     "]"};
  static const std::vector<std::string_view> native = {"<|tool_call|>",
                                                       "<|tool_args|>",
                                                       "<|tool_call_end|>",
                                                       "get_weather",
                                                       "{\"a\": 1}",
                                                       "<|tool",
                                                       " ",
                                                       "\n",
                                                       "<|",
                                                       "|>",
                                                       "<|end|>",
                                                       "x",
                                                       "{",
                                                       "}",
                                                       "\""};
  switch (f) {
    case loom::ToolCallSyntax::kKimi:
      return kimi;
    case loom::ToolCallSyntax::kDeepSeekV3:
    case loom::ToolCallSyntax::kDeepSeekV31:  // the same markers, arranged differently
      return deepseek;
    case loom::ToolCallSyntax::kQwen:
      return qwen;
    case loom::ToolCallSyntax::kNative:
      return native;
  }
  return native;
}

bool same(const loom::ParsedOutput& a, const loom::ParsedOutput& b) {
  if (a.content != b.content || a.tool_calls.size() != b.tool_calls.size()) return false;
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    if (a.tool_calls[i].id != b.tool_calls[i].id || a.tool_calls[i].name != b.tool_calls[i].name ||
        a.tool_calls[i].arguments_json != b.tool_calls[i].arguments_json) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const loom::ToolCallSyntax syntax =
      loom::kToolCallSyntaxes[data[0] % std::size(loom::kToolCallSyntaxes)];
  uint32_t seed = data[1] | 1u;
  const auto& dict = pieces(syntax);
  std::string text;
  for (size_t i = 2; i < size; ++i) {
    uint8_t b = data[i];
    if (b >= 1 && b <= 15) {
      text += dict[b - 1];
    } else {
      text.push_back(static_cast<char>(b));
    }
  }

  const loom::ParsedOutput one_shot = loom::parse_tool_calls(syntax, text);

  loom::ToolCallStreamParser parser(syntax);
  loom::ParsedOutput streamed;
  size_t pos = 0;
  while (pos < text.size()) {
    seed = seed * 1103515245u + 12345u;  // split lengths 0..16 from the input's seed byte
    size_t len = (seed >> 16) % 17;
    if (len > text.size() - pos) len = text.size() - pos;
    loom::accumulate_delta(parser.feed(std::string_view(text).substr(pos, len)), &streamed);
    pos += len;
  }
  loom::accumulate_delta(parser.finish(), &streamed);
  if (!same(one_shot, streamed)) std::abort();
  return 0;
}
