// Synthetic multi-turn tool-use dialogues (issue 14): a user asks something only a tool answers,
// the assistant calls the tool (name + JSON arguments), a tool message brings the result, and the
// assistant answers with it; one to `max_turns` such exchanges per dialogue. Two tools: `add`
// (integer arithmetic) and `lookup` (a code from a synthetic registry whose values are drawn per
// dialogue, so the answer can only be copied from the tool result).
//
// Dialogues are rendered by the engine's chat templates (engine/chat/chat_template.h, the format
// loom-server uses for a model folder without its own Jinja template) and read back by its
// tool-call parser; nothing here spells a template. Training examples score the assistant turns
// only: exactly the text each assistant message adds after its generation prompt (the reply, its
// calls and its end-of-turn marker).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/chat/chat_template.h"
#include "engine/chat/tool_call_parser.h"
#include "engine/tokenizer/tokenizer.h"
#include "trainer/synthetic_tasks.h"

namespace loom {

struct ToolDialogueOptions {
  int max_turns = 2;       // user questions per dialogue, drawn uniformly from [1, max_turns]
  int max_operand = 99;    // `add` operands in [0, max_operand]
  int registry_size = 16;  // names `lookup` knows; each dialogue draws its own codes
  // InvalidArgument naming the field when out of range.
  absl::Status validate() const;
};

// A conversation in OpenAI form: messages alternate user, assistant (one tool call), tool,
// assistant (the answer), ... Tool-call ids are "call_<k>" (k counts the dialogue's calls);
// tool_dialogue_messages() rewrites them for formats that spell ids differently (Kimi).
struct ToolDialogue {
  std::vector<ChatMessage> messages;
  std::vector<ToolDefinition> tools;
};

// Deterministic in `rng`'s state. REQUIRES: options.validate().ok().
ToolDialogue make_tool_dialogue(const ToolDialogueOptions& options, std::mt19937_64& rng);

// One assistant message of a rendered dialogue: the prompt the server would send the model for it
// (the messages before it, with the generation prompt) and the text the message adds after that
// prompt in the rendered conversation.
struct ToolDialogueTurn {
  size_t message = 0;  // index of the assistant message in ToolDialogue::messages
  RenderedChat prompt;
  std::string reply;  // e.g. "<|tool_call|>add<|tool_args|>{...}<|tool_call_end|><|end|>\n"
};

// The dialogue's assistant turns rendered in `format`. InvalidArgument when the format does not
// render the conversation incrementally (each prompt a prefix of the whole conversation).
absl::StatusOr<std::vector<ToolDialogueTurn>> tool_dialogue_turns(ChatFormat format,
                                                                  const ToolDialogue& dialogue);

// The messages as rendered for `format` (Kimi's tool-call ids are "functions.<name>:<k>").
std::vector<ChatMessage> tool_dialogue_messages(ChatFormat format, const ToolDialogue& dialogue);

// The whole dialogue as a training example: the rendered conversation (no trailing generation
// prompt) encoded as loom-server encodes prompts (special tokens only inside the template's
// markup), in pieces split at the assistant turns' boundaries so that every turn's prompt encodes
// to exactly the example's prefix; mask[i] = 1 exactly when tokens[i + 1] lies in an assistant
// turn's reply.
absl::StatusOr<Example> make_tool_dialogue_example(const Tokenizer& tokenizer, ChatFormat format,
                                                   const ToolDialogue& dialogue);

// Encodes a rendered prompt as loom-server does (Tokenizer::encode_with_special_ranges).
std::vector<int32_t> encode_chat_prompt(const Tokenizer& tokenizer, const RenderedChat& prompt);

// Scoring of one generated assistant turn, `generated` cut at the end-of-turn marker (or whole
// when the model never wrote it). A call turn is right when the text parses (in `syntax`) to
// exactly one tool call with `expected`'s name and arguments equal as JSON values; an answer turn
// when it parses to no call and its content, trimmed, equals `expected_content`.
bool tool_call_turn_correct(ToolCallSyntax syntax, std::string_view generated,
                            const ToolCall& expected);
bool answer_turn_correct(ToolCallSyntax syntax, std::string_view generated,
                         std::string_view expected_content);
// `text` up to the first `marker` (all of it when there is none).
std::string_view cut_at_marker(std::string_view text, std::string_view marker);

// Every byte range of `ranges` clipped to [begin, end), shifted to start at 0 (a rendered chat's
// markup ranges for a slice of its text).
std::vector<Tokenizer::Range> clip_ranges(const std::vector<std::pair<size_t, size_t>>& ranges,
                                          size_t begin, size_t end);

}  // namespace loom
