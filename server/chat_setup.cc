#include "server/chat_setup.h"

#include <span>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "engine/chat/chat_template_probe.h"

namespace loom {

namespace {

// The built-in template's end-of-turn marker when `tokenizer` does not encode it as one special
// token; empty otherwise.
std::string text_end_of_turn(ChatFormat format, const Tokenizer& tokenizer) {
  auto marker = end_of_turn_marker(format);
  if (!marker.ok()) return "";
  const Tokenizer::Range all{0, marker->size()};
  const std::vector<int32_t> ids =
      tokenizer.encode_with_special_ranges(*marker, std::span(&all, 1));
  if (ids.size() == 1 && tokenizer.is_special(ids[0])) return "";
  return *std::move(marker);
}

}  // namespace

absl::StatusOr<ChatSetup> load_chat_setup(const std::string& dir, std::string_view model_type,
                                          ReasoningParser reasoning_parser,
                                          const Tokenizer* tokenizer) {
  ChatSetup chat;
  chat.format = chat_format_for_model_type(model_type);
  chat.tool_call_syntax = default_tool_call_syntax(chat.format);
  chat.reasoning_parser = reasoning_parser;
  auto t = CheckpointChatTemplate::load(dir);
  if (!t.ok()) {
    if (t.status().code() != absl::StatusCode::kNotFound) return t.status();
    // The built-in template: a checkpoint's own one comes with a tokenizer whose special tokens
    // end its turns.
    if (tokenizer != nullptr) chat.end_of_turn_stop = text_end_of_turn(chat.format, *tokenizer);
    return chat;
  }
  chat.chat_template = std::make_shared<const CheckpointChatTemplate>(std::move(t).value());
  if (auto syntax = probe_tool_call_syntax(*chat.chat_template)) {
    chat.tool_call_syntax = *syntax;
    chat.syntax_from_template = true;
  }
  chat.template_writes_reasoning = template_renders_reasoning(*chat.chat_template);
  chat.reasoning = chat.template_writes_reasoning && reasoning_parser == ReasoningParser::kAuto;
  return chat;
}

std::string describe_chat_template(const ChatSetup& chat) {
  if (chat.chat_template) return absl::StrCat("the model's ", chat.chat_template->origin());
  return absl::StrCat("built-in ", absl_sv(chat_format_name(chat.format)), " format");
}

std::string describe_chat_output(const ChatSetup& chat) {
  const std::string_view family = chat_format_name(chat.format);
  std::string syntax_source;
  if (chat.syntax_from_template) {
    syntax_source = "written by the chat template";
  } else if (chat.chat_template) {
    syntax_source = absl::StrCat("the ", absl_sv(family),
                                 " family's: the chat template writes no tool call Loom parses");
  } else {
    syntax_source = absl::StrCat("the built-in ", absl_sv(family), " format's");
  }
  std::string reasoning;
  if (chat.reasoning) {
    reasoning = "<think> blocks -> reasoning_content (the chat template writes </think>)";
  } else if (chat.template_writes_reasoning) {
    reasoning = "off (--reasoning_parser=none)";
  } else if (chat.chat_template) {
    reasoning = "off (the chat template writes no </think>)";
  } else {
    reasoning = "off (built-in templates write none)";
  }
  return absl::StrCat("tool calls in ", absl_sv(tool_call_syntax_name(chat.tool_call_syntax)),
                      " syntax (", syntax_source, "); reasoning: ", reasoning);
}

}  // namespace loom
