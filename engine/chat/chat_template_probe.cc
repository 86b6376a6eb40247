#include "engine/chat/chat_template_probe.h"

#include <algorithm>
#include <string>
#include <utility>

#include "engine/chat/reasoning_parser.h"
#include "nlohmann/json.hpp"

namespace loom {
namespace {

using ojson = nlohmann::ordered_json;

// Two calls, so a syntax must also separate calls; names and arguments no template writes on its
// own, so a match cannot be a coincidence.
struct ProbeCall {
  const char* id;  // Kimi's form, which its templates print verbatim
  const char* name;
  const char* arguments;
};
constexpr ProbeCall kProbeCalls[] = {
    {"functions.loom_probe_alpha:0", "loom_probe_alpha", R"({"loom_probe": "alpha", "n": 1})"},
    {"functions.loom_probe_beta:1", "loom_probe_beta", R"({"loom_probe": ["beta", 2.5]})"},
};

// The probe conversation's two renders: the prompt up to the assistant turn (with the generation
// prompt) and the conversation including it.
struct ProbeRenders {
  std::string prompt;
  std::string conversation;
};

std::optional<ProbeRenders> render_probe(const CheckpointChatTemplate& t) {
  ojson calls = ojson::array();
  ojson tools = ojson::array();
  for (const ProbeCall& c : kProbeCalls) {
    calls.push_back({{"id", c.id},
                     {"type", "function"},
                     {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    tools.push_back({{"type", "function"},
                     {"function",
                      {{"name", c.name},
                       {"description", "Loom's tool-call probe."},
                       {"parameters", {{"type", "object"}, {"properties", ojson::object()}}}}}});
  }
  const ojson user = {{"role", "user"}, {"content", "Loom's probe question."}};
  // Arguments are strings, as requests carry them; content is "" rather than null because some
  // templates concatenate it.
  const ojson assistant = {{"role", "assistant"},
                           {"content", ""},
                           {"reasoning_content", "Loom's probe reasoning."},
                           {"tool_calls", std::move(calls)}};
  ChatTemplateInput in;
  in.tools = std::move(tools);
  in.messages = ojson::array({user});
  in.add_generation_prompt = true;
  auto prompt = t.apply(in);
  in.messages.push_back(assistant);
  in.add_generation_prompt = false;
  auto conversation = t.apply(in);
  if (!prompt.ok() || !conversation.ok()) return std::nullopt;
  return ProbeRenders{std::move(prompt).value(), std::move(conversation).value()};
}

bool recovers_probe_calls(ToolCallSyntax syntax, std::string_view turn) {
  const ParsedOutput parsed = parse_tool_calls(syntax, turn);
  if (parsed.tool_calls.size() != std::size(kProbeCalls)) return false;
  for (size_t i = 0; i < parsed.tool_calls.size(); ++i) {
    const ToolCall& got = parsed.tool_calls[i];
    const ProbeCall& want = kProbeCalls[i];
    if (got.name != want.name) return false;
    if (syntax == ToolCallSyntax::kKimi && got.id != want.id) return false;
    const auto args = ojson::parse(got.arguments_json, nullptr, /*allow_exceptions=*/false);
    if (args.is_discarded() || args != ojson::parse(want.arguments)) return false;
  }
  return true;
}

}  // namespace

std::optional<ToolCallSyntax> probe_tool_call_syntax(const CheckpointChatTemplate& chat_template) {
  const std::optional<ProbeRenders> r = render_probe(chat_template);
  if (!r) return std::nullopt;
  // The assistant turn is what the conversation adds to the prompt. Templates that render a
  // turn's opening differently in history than in the generation prompt (DeepSeek-V3.1 closes
  // the reasoning block there) still share everything up to it.
  const size_t common =
      static_cast<size_t>(std::mismatch(r->prompt.begin(), r->prompt.end(), r->conversation.begin(),
                                        r->conversation.end())
                              .first -
                          r->prompt.begin());
  const std::string_view turn = std::string_view(r->conversation).substr(common);
  for (ToolCallSyntax syntax : kToolCallSyntaxes) {
    if (recovers_probe_calls(syntax, turn)) return syntax;
  }
  return std::nullopt;
}

bool template_renders_reasoning(const CheckpointChatTemplate& chat_template) {
  const std::optional<ProbeRenders> r = render_probe(chat_template);
  return r && (r->prompt.find(kThinkEnd) != std::string::npos ||
               r->conversation.find(kThinkEnd) != std::string::npos);
}

}  // namespace loom
