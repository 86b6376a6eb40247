#include "engine/chat/chat_template.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "engine/chat/json_text.h"
#include "nlohmann/json.hpp"

namespace loom {
namespace {

using Json = nlohmann::ordered_json;
using chat_internal::dump_json_text;
using chat_internal::JsonSeparators;

// A tool definition as the OpenAI request carried it, re-serialized per template.
absl::StatusOr<std::vector<Json>> tools_to_json(const std::vector<ToolDefinition>& tools) {
  std::vector<Json> out;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ToolDefinition& t = tools[i];
    if (t.name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("tool ", i, " has no function name"));
    }
    Json fn = Json::object();
    fn["name"] = t.name;
    if (!t.description.empty()) fn["description"] = t.description;
    if (!t.parameters_json.empty()) {
      Json params = Json::parse(t.parameters_json, nullptr, /*allow_exceptions=*/false);
      if (params.is_discarded()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tool '", t.name, "': parameters is not valid JSON"));
      }
      fn["parameters"] = std::move(params);
    }
    Json tool = Json::object();
    tool["type"] = "function";
    tool["function"] = std::move(fn);
    out.push_back(std::move(tool));
  }
  return out;
}

// The prompt being rendered: template markup (where special tokens are real) and text that came
// from the request (where they are only text), with the byte ranges of the markup.
class Prompt {
 public:
  void markup(std::string_view s) {
    if (s.empty()) return;
    if (!ranges_.empty() && ranges_.back().second == text_.size()) {
      ranges_.back().second += s.size();
    } else {
      ranges_.emplace_back(text_.size(), text_.size() + s.size());
    }
    text_ += s;
  }
  void text(std::string_view s) { text_ += s; }
  RenderedChat done() && { return RenderedChat{std::move(text_), std::move(ranges_)}; }

 private:
  std::string text_;
  std::vector<std::pair<size_t, size_t>> ranges_;
};

std::string json_text(const Json& value, JsonSeparators separators) {
  std::string out;
  dump_json_text(value, separators, &out);
  return out;
}

absl::Status validate_messages(const std::vector<ChatMessage>& messages) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool") {
      return absl::InvalidArgumentError(
          absl::StrCat("message ", i, ": unknown role '", m.role, "'"));
    }
    if (!m.tool_calls.empty() && m.role != "assistant") {
      return absl::InvalidArgumentError(
          absl::StrCat("message ", i, ": role '", m.role, "' cannot carry tool_calls"));
    }
    for (const ToolCall& call : m.tool_calls) {
      if (call.name.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("message ", i, ": tool call '", call.id, "' has no function name"));
      }
      if (!Json::accept(call.arguments_json)) {
        return absl::InvalidArgumentError(absl::StrCat("message ", i, ": tool call '", call.name,
                                                       "' arguments are not valid JSON"));
      }
    }
  }
  return absl::OkStatus();
}

// Kimi-K2-Instruct chat_template.jinja (see docs/chat.md). Every turn is
// <|im_{user,assistant,system}|>{name or role}<|im_middle|>{body}<|im_end|>, no separators.
RenderedChat render_kimi(const std::vector<ChatMessage>& messages, const std::vector<Json>& tools,
                         const RenderOptions& options) {
  Prompt out;
  if (!tools.empty()) {
    out.markup("<|im_system|>tool_declare<|im_middle|>");
    out.text(json_text(Json(tools), JsonSeparators::kCompact));
    out.markup("<|im_end|>");
  }
  if (messages.empty() || messages[0].role != "system") {
    out.markup(
        "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot "
        "AI.<|im_end|>");
  }
  for (const ChatMessage& m : messages) {
    const std::string& header = m.name.empty() ? m.role : m.name;
    if (m.role == "user") {
      out.markup("<|im_user|>");
    } else if (m.role == "assistant") {
      out.markup("<|im_assistant|>");
    } else {
      out.markup("<|im_system|>");
    }
    out.text(header);
    out.markup("<|im_middle|>");
    if (m.role == "assistant" && !m.tool_calls.empty()) {
      out.text(m.content);
      out.markup("<|tool_calls_section_begin|>");
      for (size_t j = 0; j < m.tool_calls.size(); ++j) {
        const ToolCall& call = m.tool_calls[j];
        out.markup("<|tool_call_begin|>");
        // Kimi was trained on ids "functions.<name>:<index>"; synthesize one when absent.
        out.text(call.id.empty() ? absl::StrCat("functions.", call.name, ":", j) : call.id);
        out.markup("<|tool_call_argument_begin|>");
        out.text(call.arguments_json);
        out.markup("<|tool_call_end|>");
      }
      out.markup("<|tool_calls_section_end|>");
    } else if (m.role == "tool") {
      out.markup("## Return of ");
      out.text(m.tool_call_id);
      out.markup("\n");
      out.text(m.content);
    } else {
      out.text(m.content);
    }
    out.markup("<|im_end|>");
  }
  if (options.add_generation_prompt) out.markup("<|im_assistant|>assistant<|im_middle|>");
  return std::move(out).done();
}

// DeepSeek-V3 tokenizer_config.json chat_template, with its multi-turn tool-call bookkeeping
// fixed and tools declared in the system prompt as vLLM's tool_chat_template_deepseekv3.jinja
// does (see docs/chat.md).
RenderedChat render_deepseek(const std::vector<ChatMessage>& messages,
                             const std::vector<Json>& tools, const RenderOptions& options) {
  Prompt out;
  out.markup("<｜begin▁of▁sentence｜>");
  bool first_system = true;
  for (const ChatMessage& m : messages) {
    if (m.role != "system") continue;
    if (!first_system) out.markup("\n\n");
    out.text(m.content);
    first_system = false;
  }
  if (!tools.empty()) {
    out.markup(
        "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou "
        "are provided with function signatures within <tools></tools> XML tags:\n<tools>");
    for (const Json& tool : tools) {
      out.markup("\n");
      out.text(json_text(tool, JsonSeparators::kPython));
    }
    out.markup(
        "\n</tools>\n\nFor function call returns, you should first print "
        "<｜tool▁calls▁begin｜>For each function call, you should return object "
        "like:\n<｜tool▁call▁begin｜>function<｜tool▁sep｜><function_name>\n```json\n<function_"
        "arguments_in_json_format>\n```<｜tool▁call▁end｜>At the end of function call returns, you "
        "should print <｜tool▁calls▁end｜><｜end▁of▁sentence｜>");
  }
  bool is_tool = false;  // inside a run of tool outputs
  for (const ChatMessage& m : messages) {
    if (m.role == "user") {
      if (is_tool) out.markup("<｜tool▁outputs▁end｜>");
      is_tool = false;
      out.markup("<｜User｜>");
      out.text(m.content);
    } else if (m.role == "assistant") {
      if (is_tool) {
        out.markup("<｜tool▁outputs▁end｜>");
      } else {
        out.markup("<｜Assistant｜>");
      }
      std::string_view content = m.content;
      if (m.tool_calls.empty() && !is_tool) {
        // The template drops any reasoning before "</think>" from history.
        size_t think_end = content.find("</think>");
        if (think_end != std::string_view::npos) content.remove_prefix(think_end + 8);
      }
      out.text(content);
      is_tool = false;
      if (!m.tool_calls.empty()) {
        out.markup("<｜tool▁calls▁begin｜>");
        for (size_t j = 0; j < m.tool_calls.size(); ++j) {
          if (j > 0) out.markup("\n");
          out.markup("<｜tool▁call▁begin｜>function<｜tool▁sep｜>");
          out.text(m.tool_calls[j].name);
          out.markup("\n```json\n");
          out.text(m.tool_calls[j].arguments_json);
          out.markup("\n```<｜tool▁call▁end｜>");
        }
        out.markup("<｜tool▁calls▁end｜>");
      }
      out.markup("<｜end▁of▁sentence｜>");
    } else if (m.role == "tool") {
      out.markup(is_tool ? "\n<｜tool▁output▁begin｜>"
                         : "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>");
      out.text(m.content);
      out.markup("<｜tool▁output▁end｜>");
      is_tool = true;
    }
  }
  if (is_tool) out.markup("<｜tool▁outputs▁end｜>");
  if (options.add_generation_prompt && !is_tool) out.markup("<｜Assistant｜>");
  return std::move(out).done();
}

// Qwen3-Next-80B-A3B-Instruct / Qwen3 chat_template (see docs/chat.md).
RenderedChat render_qwen(const std::vector<ChatMessage>& messages, const std::vector<Json>& tools,
                         const RenderOptions& options) {
  Prompt out;
  const bool first_is_system = !messages.empty() && messages[0].role == "system";
  if (!tools.empty()) {
    out.markup("<|im_start|>system\n");
    if (first_is_system) {
      out.text(messages[0].content);
      out.markup("\n\n");
    }
    out.markup(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "
        "provided with function signatures within <tools></tools> XML tags:\n<tools>");
    for (const Json& tool : tools) {
      out.markup("\n");
      out.text(json_text(tool, JsonSeparators::kPython));
    }
    out.markup(
        "\n</tools>\n\nFor each function call, return a json object with function name and "
        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
        "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n");
  } else if (first_is_system) {
    out.markup("<|im_start|>system\n");
    out.text(messages[0].content);
    out.markup("<|im_end|>\n");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user" || (m.role == "system" && i > 0)) {
      out.markup("<|im_start|>");
      out.text(m.role);
      out.markup("\n");
      out.text(m.content);
      out.markup("<|im_end|>\n");
    } else if (m.role == "assistant") {
      out.markup("<|im_start|>assistant\n");
      out.text(m.content);
      for (size_t j = 0; j < m.tool_calls.size(); ++j) {
        if (j > 0 || !m.content.empty()) out.markup("\n");
        out.markup("<tool_call>\n{\"name\": \"");
        out.text(m.tool_calls[j].name);
        out.markup("\", \"arguments\": ");
        out.text(m.tool_calls[j].arguments_json);
        out.markup("}\n</tool_call>");
      }
      out.markup("<|im_end|>\n");
    } else if (m.role == "tool") {
      if (i == 0 || messages[i - 1].role != "tool") out.markup("<|im_start|>user");
      out.markup("\n<tool_response>\n");
      out.text(m.content);
      out.markup("\n</tool_response>");
      if (i + 1 == messages.size() || messages[i + 1].role != "tool") out.markup("<|im_end|>\n");
    }
  }
  if (options.add_generation_prompt) out.markup("<|im_start|>assistant\n");
  return std::move(out).done();
}

// Loom's native format (docs/chat.md): <|start|>{role}\n{body}<|end|>\n per turn.
RenderedChat render_native(const std::vector<ChatMessage>& messages, const std::vector<Json>& tools,
                           const RenderOptions& options) {
  Prompt out;
  size_t first = 0;
  if (!messages.empty() && messages[0].role == "system") {
    out.markup("<|start|>system\n");
    out.text(messages[0].content);
    out.markup("<|end|>\n");
    first = 1;
  }
  if (!tools.empty()) {
    out.markup("<|start|>tools\n");
    out.text(json_text(Json(tools), JsonSeparators::kCompact));
    out.markup("<|end|>\n");
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    out.markup("<|start|>");
    out.text(m.role);
    if (m.role == "tool" && !m.tool_call_id.empty()) {
      out.markup(" ");
      out.text(m.tool_call_id);
    }
    out.markup("\n");
    out.text(m.content);
    for (const ToolCall& call : m.tool_calls) {
      out.markup("<|tool_call|>");
      out.text(call.name);
      out.markup("<|tool_args|>");
      out.text(call.arguments_json);
      out.markup("<|tool_call_end|>");
    }
    out.markup("<|end|>\n");
  }
  if (options.add_generation_prompt) out.markup("<|start|>assistant\n");
  return std::move(out).done();
}

}  // namespace

std::string_view chat_format_name(ChatFormat format) {
  switch (format) {
    case ChatFormat::kKimi:
      return "kimi";
    case ChatFormat::kDeepSeek:
      return "deepseek";
    case ChatFormat::kQwen:
      return "qwen";
    case ChatFormat::kNative:
      return "native";
  }
  return "native";
}

ChatFormat chat_format_for_model_type(std::string_view model_type) {
  if (model_type == "kimi_linear" || model_type == "kimi_k2") return ChatFormat::kKimi;
  if (model_type == "deepseek_v3") return ChatFormat::kDeepSeek;
  if (model_type == "qwen3_next" || model_type == "qwen3" || model_type == "qwen3_moe") {
    return ChatFormat::kQwen;
  }
  return ChatFormat::kNative;  // kda, loom, and anything trained by loom-trainer
}

absl::StatusOr<std::vector<ToolDefinition>> parse_openai_tools(std::string_view tools_json) {
  Json j = Json::parse(tools_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_array()) {
    return absl::InvalidArgumentError("tools: not a JSON array");
  }
  std::vector<ToolDefinition> out;
  for (size_t i = 0; i < j.size(); ++i) {
    const Json& t = j[i];
    if (!t.is_object() || !t.contains("type") || t["type"] != "function" ||
        !t.contains("function") || !t["function"].is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tools[", i, "]: expected {\"type\": \"function\", \"function\": {...}}"));
    }
    const Json& fn = t["function"];
    if (!fn.contains("name") || !fn["name"].is_string() ||
        fn["name"].get_ref<const std::string&>().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("tools[", i, "]: function.name missing"));
    }
    ToolDefinition def;
    def.name = fn["name"].get<std::string>();
    if (fn.contains("description")) {
      if (!fn["description"].is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tool '", def.name, "': description is not a string"));
      }
      def.description = fn["description"].get<std::string>();
    }
    if (fn.contains("parameters")) {
      if (!fn["parameters"].is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tool '", def.name, "': parameters is not a JSON object"));
      }
      def.parameters_json = fn["parameters"].dump();
    }
    out.push_back(std::move(def));
  }
  return out;
}

absl::StatusOr<std::string> render_chat(ChatFormat format, const std::vector<ChatMessage>& messages,
                                        const std::vector<ToolDefinition>& tools,
                                        const RenderOptions& options) {
  LOOM_ASSIGN_OR_RETURN(RenderedChat rendered,
                        render_chat_prompt(format, messages, tools, options));
  return std::move(rendered.text);
}

absl::StatusOr<RenderedChat> render_chat_prompt(ChatFormat format,
                                                const std::vector<ChatMessage>& messages,
                                                const std::vector<ToolDefinition>& tools,
                                                const RenderOptions& options) {
  LOOM_RETURN_IF_ERROR(validate_messages(messages));
  LOOM_ASSIGN_OR_RETURN(std::vector<Json> tools_json, tools_to_json(tools));
  switch (format) {
    case ChatFormat::kKimi:
      return render_kimi(messages, tools_json, options);
    case ChatFormat::kDeepSeek:
      return render_deepseek(messages, tools_json, options);
    case ChatFormat::kQwen:
      return render_qwen(messages, tools_json, options);
    case ChatFormat::kNative:
      return render_native(messages, tools_json, options);
  }
  return absl::InvalidArgumentError("unknown chat format");
}

absl::StatusOr<std::string> end_of_turn_marker(ChatFormat format) {
  const std::vector<ChatMessage> q = {{.role = "user", .content = "q"}};
  auto prompt = render_chat(format, q, {}, {.add_generation_prompt = true});
  if (!prompt.ok()) return prompt.status();
  std::vector<ChatMessage> qa = q;
  qa.push_back({.role = "assistant", .content = "a"});
  auto whole = render_chat(format, qa, {}, {.add_generation_prompt = false});
  if (!whole.ok()) return whole.status();
  if (!whole->starts_with(*prompt + "a"))
    return absl::InvalidArgumentError(absl::StrCat("the ", absl_sv(chat_format_name(format)),
                                                   " template writes no plain end of turn"));
  std::string marker(absl::StripAsciiWhitespace(whole->substr(prompt->size() + 1)));
  if (marker.empty())
    return absl::InvalidArgumentError(absl::StrCat("the ", absl_sv(chat_format_name(format)),
                                                   " template writes no end-of-turn marker"));
  return marker;
}

}  // namespace loom
