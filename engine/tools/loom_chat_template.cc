// loom-chat-template: renders a checkpoint's own chat template, one conversation per line.
//
//   loom-chat-template --template DIR < lines
//
// DIR holds chat_template.jinja and/or tokenizer_config.json (its chat_template and special
// tokens; see engine/chat/checkpoint_chat_template.h). Each stdin line is a JSON object
// {"messages": [...], "tools": [...] or null, "add_generation_prompt": bool, "kwargs": {...}}
// (all but messages optional); each stdout line is the rendered text as a JSON string, or
// {"error": "..."} when that input cannot be rendered (malformed line, template error,
// raise_exception, empty conversation). --raw renders as transformers' render_jinja_template
// (no apply_chat_template checks: an empty conversation is rendered).
//
// Exit status: 0 when every line was answered, 1 when the template cannot be loaded, 2 on usage.
#include <cstdio>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "engine/chat/checkpoint_chat_template.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, template, "",
          "a folder with chat_template.jinja and/or tokenizer_config.json");
ABSL_FLAG(bool, raw, false, "render without apply_chat_template's checks (empty conversations)");

namespace {

using json = nlohmann::ordered_json;

std::string error_line(std::string_view message) {
  json j = json::object();
  j["error"] = std::string(message);
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string answer(const loom::CheckpointChatTemplate& t, const std::string& line, bool raw) {
  const json in = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (in.is_discarded() || !in.is_object()) return error_line("input line is not a JSON object");
  for (const auto& [k, v] : in.items()) {
    if (k != "messages" && k != "tools" && k != "add_generation_prompt" && k != "kwargs") {
      return error_line("unknown field '" + k + "'");
    }
  }
  loom::ChatTemplateInput input;
  if (!in.contains("messages")) return error_line("missing field 'messages'");
  input.messages = in["messages"];
  if (in.contains("tools")) input.tools = in["tools"];
  if (in.contains("add_generation_prompt")) {
    if (!in["add_generation_prompt"].is_boolean()) {
      return error_line("add_generation_prompt must be a boolean");
    }
    input.add_generation_prompt = in["add_generation_prompt"].get<bool>();
  }
  if (in.contains("kwargs")) input.kwargs = in["kwargs"];
  auto text = raw ? t.render(input) : t.apply(input);
  if (!text.ok()) return error_line(std::string(text.status().message()));
  return json(*text).dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("loom-chat-template --template DIR [--raw] < lines");
  absl::ParseCommandLine(argc, argv);
  const std::string dir = absl::GetFlag(FLAGS_template);
  if (dir.empty()) {
    std::fprintf(stderr, "loom-chat-template: --template is required\n");
    return 2;
  }
  auto t = loom::CheckpointChatTemplate::load(dir);
  if (!t.ok()) {
    std::fprintf(stderr, "loom-chat-template: %s\n", std::string(t.status().message()).c_str());
    return 1;
  }
  const bool raw = absl::GetFlag(FLAGS_raw);
  std::string line;
  while (std::getline(std::cin, line)) {
    std::cout << answer(*t, line, raw) << '\n' << std::flush;
  }
  return 0;
}
