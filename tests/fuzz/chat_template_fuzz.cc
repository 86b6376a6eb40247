// libFuzzer target: a chat template (Loom's Jinja interpreter, engine/chat/jinja_*) parsed and
// rendered. The input is the template source, optionally followed by a NUL byte and a JSON object
// {"messages", "tools", "add_generation_prompt", "kwargs"}; without one (or when it is not valid
// JSON) a fixed conversation with a system prompt, tool call, tool result and a tool definition
// is rendered. Each template is rendered twice as a Kimi checkpoint's (tools deep-sorted) and
// once as a plain one. Asserts that nothing crashes, that rendering is deterministic, and that
// every error is an InvalidArgument naming the chat template, and that apply_prompt gives the same
// text with sorted, disjoint markup ranges.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "engine/chat/checkpoint_chat_template.h"
#include "nlohmann/json.hpp"

namespace {

using json = nlohmann::ordered_json;

const json& default_input() {
  static const json input = json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather in Paris?", "name": "ann"},
      {"role": "assistant", "content": null, "reasoning_content": "look it up",
       "tool_calls": [{"id": "call_0", "type": "function",
                       "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_0", "content": "21 C"},
      {"role": "user", "content": [{"type": "text", "text": "thanks"}, {"type": "image_url"}]}
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "d",
               "parameters": {"type": "object", "required": ["city"],
                              "properties": {"city": {"type": "string"}}}}}],
    "add_generation_prompt": true,
    "kwargs": {"thinking": true, "n": 1.5}
  })");
  return input;
}

void check(bool ok) {
  if (!ok) std::abort();
}

void run(const loom::CheckpointChatTemplate& t, const loom::ChatTemplateInput& in) {
  auto a = t.render(in);
  auto b = t.render(in);
  check(a.ok() == b.ok());
  if (a.ok()) {
    check(*a == *b);
    // The prompt form has the same text and well-formed markup ranges.
    if (!in.messages.empty()) {
      auto p = t.apply_prompt(in);
      check(p.ok() && p->text == *a);
      size_t end = 0;
      for (const auto& [lo, hi] : p->markup_ranges) {
        check(end <= lo && lo < hi);
        end = hi;
      }
      check(end <= p->text.size());
    }
  } else {
    check(a.status().code() == absl::StatusCode::kInvalidArgument);
    check(a.status() == b.status());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  const size_t nul = all.find('\0');
  const std::string_view source = all.substr(0, nul);
  json input = default_input();
  if (nul != std::string_view::npos) {
    json parsed = json::parse(all.substr(nul + 1), nullptr, /*allow_exceptions=*/false);
    if (parsed.is_object()) input = std::move(parsed);
  }
  loom::ChatTemplateInput in;
  in.messages = input.value("messages", json::array());
  in.tools = input.value("tools", json());
  const json gen = input.value("add_generation_prompt", json(false));
  in.add_generation_prompt = gen.is_boolean() && gen.get<bool>();
  in.kwargs = input.value("kwargs", json());

  static const json kimi_config = json::parse(
      R"({"bos_token": "[BOS]", "eos_token": {"content": "[EOS]", "special": true},
          "tokenizer_class": "TikTokenTokenizer"})");
  static const json plain_config = json::parse(R"({"eos_token": "<|im_end|>", "bos_token": null})");
  for (const json* config : {&kimi_config, &plain_config}) {
    auto t = loom::CheckpointChatTemplate::create(source, *config, "fuzz");
    auto again = loom::CheckpointChatTemplate::create(source, *config, "fuzz");
    check(t.ok() == again.ok());
    if (!t.ok()) {
      check(t.status().code() == absl::StatusCode::kInvalidArgument);
      check(t.status().message().find("chat template") != std::string_view::npos);
      return 0;
    }
    run(*t, in);
  }
  return 0;
}
