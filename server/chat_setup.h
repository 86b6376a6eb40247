// ChatSetup: how loom-server renders chat prompts and reads the replies of its model, decided once
// at startup from the model folder (docs/chat.md): the checkpoint's own chat template when it has
// one, else the family's built-in template; the tool-call syntax that template writes, else the
// family's; and whether replies open with a reasoning block to split off.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/chat/chat_template.h"
#include "engine/chat/checkpoint_chat_template.h"
#include "engine/chat/tool_call_parser.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/server_options.h"

namespace loom {

struct ChatSetup {
  ChatFormat format = ChatFormat::kNative;  // the family, from config.json's model_type
  // The checkpoint's own template; null: `format`'s built-in one.
  std::shared_ptr<const CheckpointChatTemplate> chat_template;
  ToolCallSyntax tool_call_syntax = ToolCallSyntax::kNative;
  bool syntax_from_template = false;       // false: the family's (the template wrote none we know)
  bool template_writes_reasoning = false;  // the template writes </think>
  bool reasoning = false;                  // replies' reasoning blocks become reasoning_content
  ReasoningParser reasoning_parser = ReasoningParser::kAuto;
  // A stop string every chat reply gets: the built-in template's end-of-turn marker when the
  // model's tokenizer spells it as text (the byte-level tokenizer of loom-trainer's models) rather
  // than as one special token, which the model's EOS ids or a client's stop_token_ids end a reply
  // at. Without it such a model's reply runs through "<|end|>" into an invented next turn until
  // max_tokens. Empty: none.
  std::string end_of_turn_stop;
};

// Loads `dir`'s chat template if it has one and probes it (chat_template_probe.h). InvalidArgument
// naming the file when the folder's template is malformed. `tokenizer` (null: the model is served
// without one) decides end_of_turn_stop.
absl::StatusOr<ChatSetup> load_chat_setup(const std::string& dir, std::string_view model_type,
                                          ReasoningParser reasoning_parser,
                                          const Tokenizer* tokenizer);

// For the startup lines: "the model's DIR/chat_template.jinja" or "built-in kimi format".
std::string describe_chat_template(const ChatSetup& chat);
// "tool calls in kimi syntax (...); reasoning: ... (...)", each with where it comes from.
std::string describe_chat_output(const ChatSetup& chat);

}  // namespace loom
