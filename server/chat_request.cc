#include "server/chat_request.h"

#include <utility>

#include "core/status.h"

namespace loom {

absl::StatusOr<PreparedChat> prepare_chat(const OpenAiRequest& req, const Tokenizer& tokenizer,
                                          const ChatSetup& chat, int32_t max_model_len) {
  LOOM_CHECK(req.chat, "prepare_chat takes a chat request");
  bool opens_reasoning = false;
  LOOM_ASSIGN_OR_RETURN(std::vector<Request> requests,
                        build_engine_requests(req, tokenizer, chat.format, max_model_len,
                                              chat.chat_template.get(), &opens_reasoning));
  LOOM_CHECK(requests.size() == 1, "a chat request renders one prompt, not %zu", requests.size());
  PreparedChat out;
  out.request = std::move(requests[0]);
  out.output.reasoning = chat.reasoning;
  out.output.starts_in_reasoning = opens_reasoning;
  if (req.parse_tools()) out.output.tool_calls = chat.tool_call_syntax;
  return out;
}

ChatReplyReader::ChatReplyReader(const ChatOutputOptions& output) {
  if (output.reasoning || output.tool_calls.has_value()) parser_.emplace(output);
}

ChatDelta ChatReplyReader::feed(const RequestOutput& out) {
  ChatDelta delta;
  if (finished_) return delta;  // one final event per choice
  if (parser_) {
    delta = parser_->feed(out.text);
    if (out.finish) {
      ChatDelta tail = parser_->finish();
      delta.reasoning += tail.reasoning;
      delta.content += tail.content;
      delta.tool_calls.insert(delta.tool_calls.end(), tail.tool_calls.begin(),
                              tail.tool_calls.end());
    }
  } else {
    delta.content = out.text;
  }
  finished_ = out.finish.has_value();
  if (!delta.tool_calls.empty()) made_tool_calls_ = true;
  return delta;
}

std::string_view chat_finish_reason(FinishReason reason, bool made_tool_calls) {
  if (reason == FinishReason::kStop && made_tool_calls) return "tool_calls";
  return finish_reason_name(reason);
}

}  // namespace loom
