#include "engine/chat/chat_output_parser.h"

#include <utility>

namespace loom {

ChatOutputParser::ChatOutputParser(const ChatOutputOptions& options) {
  if (options.reasoning) reasoning_.emplace(options.starts_in_reasoning);
  if (options.tool_calls) tool_calls_.emplace(*options.tool_calls);
}

ChatDelta ChatOutputParser::answer(const ReasoningSplit& split, bool eof) {
  ChatDelta out;
  if (tool_calls_) {
    out = tool_calls_->feed(split.answer);
    if (eof) {
      ChatDelta tail = tool_calls_->finish();
      out.content += tail.content;
      for (ToolCallDelta& d : tail.tool_calls) out.tool_calls.push_back(std::move(d));
    }
  } else {
    out.content = split.answer;
  }
  out.reasoning = split.reasoning;
  return out;
}

ChatDelta ChatOutputParser::feed(std::string_view text) {
  if (!reasoning_) return answer({"", std::string(text)}, /*eof=*/false);
  return answer(reasoning_->feed(text), /*eof=*/false);
}

ChatDelta ChatOutputParser::finish() {
  if (!reasoning_) return answer({}, /*eof=*/true);
  return answer(reasoning_->finish(), /*eof=*/true);
}

ParsedOutput parse_chat_output(const ChatOutputOptions& options, std::string_view text) {
  ChatOutputParser parser(options);
  ParsedOutput out;
  accumulate_delta(parser.feed(text), &out);
  accumulate_delta(parser.finish(), &out);
  return out;
}

}  // namespace loom
