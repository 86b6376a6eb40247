#include "server/chat_request.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "engine/sampling/sampling_params.h"

namespace loom {

namespace {

// Whether encode_chat_text matches a special token at bytes [begin, end) of `rendered`: anywhere
// with parse_special_tokens, else inside the markup (touching ranges merged, as the tokenizer
// merges them).
bool special_allowed(const OpenAiRequest& req, const RenderedChat& rendered, size_t begin,
                     size_t end) {
  if (req.parse_special_tokens) return true;
  size_t run_begin = 0, run_end = 0;
  bool open = false;
  for (const auto& [b, e] : rendered.markup_ranges) {
    if (open && b <= run_end) {
      run_end = std::max(run_end, e);
    } else {
      if (open && run_begin <= begin && end <= run_end) return true;
      run_begin = b;
      run_end = e;
      open = true;
    }
  }
  return open && run_begin <= begin && end <= run_end;
}

}  // namespace

absl::StatusOr<PreparedChat> prepare_chat(const OpenAiRequest& req, const Tokenizer& tokenizer,
                                          const ChatSetup& chat, int32_t max_model_len,
                                          const ConversationTokens* continues, bool keep_prompt) {
  LOOM_CHECK(req.chat, "prepare_chat takes a chat request");
  bool opens_reasoning = false;
  LOOM_ASSIGN_OR_RETURN(
      RenderedChat rendered,
      render_chat_request(req, chat.format, chat.chat_template.get(), &opens_reasoning));
  PreparedChat out;
  std::optional<std::vector<int32_t>> ids;
  if (continues != nullptr) {
    ids = split_conversation(
        *continues, rendered.text, tokenizer,
        [&](size_t b, size_t e) { return special_allowed(req, rendered, b, e); },
        [&](size_t begin) { return encode_chat_text(req, tokenizer, rendered, begin); },
        &out.encoded_bytes);
    out.continued = ids.has_value();
  }
  if (!ids) {
    ids = encode_chat_text(req, tokenizer, rendered);
    out.encoded_bytes += rendered.text.size();
  }
  if (keep_prompt) {
    auto prompt = std::make_shared<ConversationTokens>();
    prompt->tokens = *ids;
    prompt->text = std::move(rendered.text);
    out.prompt = std::move(prompt);
  }
  LOOM_ASSIGN_OR_RETURN(out.request, engine_request(req, *std::move(ids), max_model_len));
  std::vector<std::string>& stop = out.request.params.stop;
  if (!chat.end_of_turn_stop.empty() &&
      std::find(stop.begin(), stop.end(), chat.end_of_turn_stop) == stop.end()) {
    if (stop.size() >= static_cast<size_t>(kMaxStopStrings))
      return absl::InvalidArgumentError(absl::StrCat(
          "stop: at most ", kMaxStopStrings - 1, " strings in a chat request to this model: its ",
          "replies also stop at the end of turn \"", chat.end_of_turn_stop, "\""));
    stop.push_back(chat.end_of_turn_stop);
  }
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
