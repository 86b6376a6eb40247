#include "trainer/tool_dialogues.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "nlohmann/json.hpp"

namespace loom {
namespace {

constexpr const char* kSyllables[] = {"ka", "lo", "mi", "ru", "te", "vo", "zan", "pe"};

// The registry's k-th name: two or three syllables spelled from k's base-8 digits.
std::string registry_name(int k) {
  std::string name = kSyllables[k % 8];
  name += kSyllables[(k / 8) % 8];
  if (k >= 64) name += kSyllables[(k / 64) % 8];
  return name;
}

std::vector<ToolDefinition> dialogue_tools() {
  return {
      {"add", "Adds two integers.",
       R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, )"
       R"("required": ["a", "b"]})"},
      {"lookup", "Returns the registry code of a name.",
       R"({"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]})"},
  };
}

}  // namespace

absl::Status ToolDialogueOptions::validate() const {
  if (max_turns < 1 || max_turns > 64)
    return absl::InvalidArgumentError(
        absl::StrCat("tool_dialogue: max_turns ", max_turns, " outside [1, 64]"));
  if (max_operand < 1 || max_operand > 1000000)
    return absl::InvalidArgumentError(
        absl::StrCat("tool_dialogue: max_operand ", max_operand, " outside [1, 1000000]"));
  if (registry_size < 1 || registry_size > 512)
    return absl::InvalidArgumentError(
        absl::StrCat("tool_dialogue: registry_size ", registry_size, " outside [1, 512]"));
  return absl::OkStatus();
}

ToolDialogue make_tool_dialogue(const ToolDialogueOptions& o, std::mt19937_64& rng) {
  ToolDialogue d;
  d.tools = dialogue_tools();
  const int turns = std::uniform_int_distribution<int>(1, o.max_turns)(rng);
  std::uniform_int_distribution<int> tool(0, 1), operand(0, o.max_operand);
  std::uniform_int_distribution<int> name(0, o.registry_size - 1), code(1000, 9999);
  for (int k = 0; k < turns; ++k) {
    ChatMessage user{.role = "user"}, call{.role = "assistant"}, result{.role = "tool"};
    ChatMessage answer{.role = "assistant"};
    const std::string id = absl::StrCat("call_", k);
    if (tool(rng) == 0) {
      const int a = operand(rng), b = operand(rng);
      user.content = absl::StrCat("What is ", a, " plus ", b, "?");
      call.tool_calls.push_back({id, "add", absl::StrCat(R"({"a": )", a, R"(, "b": )", b, "}")});
      result.content = absl::StrCat(a + b);
      answer.content = absl::StrCat(a, " plus ", b, " is ", a + b, ".");
    } else {
      const std::string who = registry_name(name(rng));
      const int value = code(rng);
      user.content = absl::StrCat("What is the code of ", who, "?");
      call.tool_calls.push_back({id, "lookup", absl::StrCat(R"({"name": ")", who, R"("})")});
      result.content = absl::StrCat(value);
      answer.content = absl::StrCat("The code of ", who, " is ", value, ".");
    }
    result.tool_call_id = id;
    d.messages.push_back(std::move(user));
    d.messages.push_back(std::move(call));
    d.messages.push_back(std::move(result));
    d.messages.push_back(std::move(answer));
  }
  return d;
}

std::vector<ChatMessage> tool_dialogue_messages(ChatFormat format, const ToolDialogue& dialogue) {
  std::vector<ChatMessage> messages = dialogue.messages;
  if (format != ChatFormat::kKimi) return messages;
  // Kimi writes (and its parser expects) ids "functions.<name>:<index>".
  std::vector<std::pair<std::string, std::string>> renamed;
  for (ChatMessage& m : messages) {
    for (ToolCall& c : m.tool_calls) {
      std::string id = absl::StrCat("functions.", c.name, ":", renamed.size());
      renamed.emplace_back(c.id, id);
      c.id = std::move(id);
    }
    if (m.role == "tool")
      for (const auto& [from, to] : renamed)
        if (m.tool_call_id == from) m.tool_call_id = to;
  }
  return messages;
}

absl::StatusOr<std::vector<ToolDialogueTurn>> tool_dialogue_turns(ChatFormat format,
                                                                  const ToolDialogue& dialogue) {
  const std::vector<ChatMessage> messages = tool_dialogue_messages(format, dialogue);
  auto whole = render_chat(format, messages, dialogue.tools, {.add_generation_prompt = false});
  if (!whole.ok()) return whole.status();
  std::vector<ToolDialogueTurn> turns;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role != "assistant") continue;
    const std::vector<ChatMessage> before(messages.begin(), messages.begin() + i);
    auto prompt =
        render_chat_prompt(format, before, dialogue.tools, {.add_generation_prompt = true});
    if (!prompt.ok()) return prompt.status();
    const std::vector<ChatMessage> upto(messages.begin(), messages.begin() + i + 1);
    auto with = render_chat(format, upto, dialogue.tools, {.add_generation_prompt = false});
    if (!with.ok()) return with.status();
    if (!with->starts_with(prompt->text) || !whole->starts_with(*with))
      return absl::InvalidArgumentError(absl::StrCat(
          "tool_dialogue: the ", absl_sv(chat_format_name(format)),
          " template does not render the conversation incrementally (message ", i, ")"));
    std::string reply = with->substr(prompt->text.size());
    turns.push_back({i, std::move(prompt).value(), std::move(reply)});
  }
  return turns;
}

std::vector<int32_t> encode_chat_prompt(const Tokenizer& tokenizer, const RenderedChat& prompt) {
  const std::vector<Tokenizer::Range> ranges =
      clip_ranges(prompt.markup_ranges, 0, prompt.text.size());
  return tokenizer.encode_with_special_ranges(prompt.text, ranges);
}

absl::StatusOr<Example> make_tool_dialogue_example(const Tokenizer& tokenizer, ChatFormat format,
                                                   const ToolDialogue& dialogue) {
  auto turns = tool_dialogue_turns(format, dialogue);
  if (!turns.ok()) return turns.status();
  auto whole = render_chat_prompt(format, tool_dialogue_messages(format, dialogue), dialogue.tools,
                                  {.add_generation_prompt = false});
  if (!whole.ok()) return whole.status();
  Example ex;
  // Appends whole->text[begin, end) encoded on its own; marks what predicts it when `scored`.
  auto append = [&](size_t begin, size_t end, bool scored) {
    if (begin >= end) return;
    const std::vector<int32_t> ids = tokenizer.encode_with_special_ranges(
        std::string_view(whole->text).substr(begin, end - begin),
        clip_ranges(whole->markup_ranges, begin, end));
    if (scored && !ex.loss_mask.empty()) ex.loss_mask.back() = 1;
    for (size_t i = 0; i < ids.size(); ++i) {
      ex.tokens.push_back(ids[i]);
      ex.loss_mask.push_back(scored && i + 1 < ids.size() ? 1 : 0);
    }
  };
  size_t done = 0;
  for (const ToolDialogueTurn& t : *turns) {
    append(done, t.prompt.text.size(), false);
    append(t.prompt.text.size(), t.prompt.text.size() + t.reply.size(), true);
    done = t.prompt.text.size() + t.reply.size();
  }
  append(done, whole->text.size(), false);
  if (!ex.loss_mask.empty()) ex.loss_mask.back() = 0;
  return ex;
}

std::string_view cut_at_marker(std::string_view text, std::string_view marker) {
  const size_t at = marker.empty() ? std::string_view::npos : text.find(marker);
  return at == std::string_view::npos ? text : text.substr(0, at);
}

bool tool_call_turn_correct(ToolCallSyntax syntax, std::string_view generated,
                            const ToolCall& expected) {
  const ParsedOutput out = parse_tool_calls(syntax, generated);
  if (out.tool_calls.size() != 1 || out.tool_calls[0].name != expected.name) return false;
  const auto got = nlohmann::json::parse(out.tool_calls[0].arguments_json, nullptr, false);
  const auto want = nlohmann::json::parse(expected.arguments_json, nullptr, false);
  return !got.is_discarded() && !want.is_discarded() && got == want;
}

bool answer_turn_correct(ToolCallSyntax syntax, std::string_view generated,
                         std::string_view expected_content) {
  const ParsedOutput out = parse_tool_calls(syntax, generated);
  return out.tool_calls.empty() && absl::StripAsciiWhitespace(out.content) ==
                                       absl::StripAsciiWhitespace(absl_sv(expected_content));
}

std::vector<Tokenizer::Range> clip_ranges(const std::vector<std::pair<size_t, size_t>>& ranges,
                                          size_t begin, size_t end) {
  std::vector<Tokenizer::Range> out;
  for (const auto& [b, e] : ranges) {
    const size_t lo = std::max(b, begin), hi = std::min(e, end);
    if (lo < hi) out.push_back({lo - begin, hi - begin});
  }
  return out;
}

}  // namespace loom
