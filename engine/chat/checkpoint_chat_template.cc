#include "engine/chat/checkpoint_chat_template.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

absl::StatusOr<std::string> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError("cannot read " + path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<json> read_json(const fs::path& path) {
  auto text = read_file(path);
  if (!text.ok()) return text.status();
  json j = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(path.string() + ": not valid JSON");
  return j;
}

// tokenizer_config.json's chat_template: a string, or [{"name", "template"}, ...] ("default").
absl::StatusOr<std::string> template_from_config(const json& config, const std::string& file) {
  const json& t = config["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array()) {
    for (const json& entry : t) {
      if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") ||
          !entry["template"].is_string()) {
        return absl::InvalidArgumentError(
            file + ": chat_template list entries must be {\"name\": ..., \"template\": ...}");
      }
      if (entry["name"] == "default") return entry["template"].get<std::string>();
    }
    return absl::InvalidArgumentError(file +
                                      ": chat_template lists named templates but none is "
                                      "\"default\"");
  }
  return absl::InvalidArgumentError(file + ": chat_template must be a string or a list");
}

bool is_kimi_tokenizer(const json& config) {
  if (!config.is_object()) return false;
  if (config.contains("tokenizer_class") && config["tokenizer_class"] == "TikTokenTokenizer") {
    return true;
  }
  if (config.contains("auto_map")) {
    return config["auto_map"].dump().find("tokenization_kimi") != std::string::npos;
  }
  return false;
}

constexpr const char* kSpecialTokenKeys[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                             "pad_token", "cls_token", "mask_token"};

}  // namespace

json deep_sort_keys(const json& value) {
  if (value.is_object()) {
    std::vector<std::pair<std::string, const json*>> items;
    for (const auto& [k, v] : value.items()) items.emplace_back(k, &v);
    std::stable_sort(items.begin(), items.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    json out = json::object();
    for (const auto& [k, v] : items) out[k] = deep_sort_keys(*v);
    return out;
  }
  if (value.is_array()) {
    json out = json::array();
    for (const json& v : value) out.push_back(deep_sort_keys(v));
    return out;
  }
  return value;
}

absl::StatusOr<CheckpointChatTemplate> CheckpointChatTemplate::create(std::string_view source,
                                                                      const json& config,
                                                                      std::string origin) {
  CheckpointChatTemplate t;
  t.source_ = std::string(source);
  t.origin_ = std::move(origin);
  auto parsed = jinja::Template::parse(source);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(t.origin_ + ": " + std::string(parsed.status().message()));
  }
  t.template_ = std::move(*parsed);
  if (config.is_object()) {
    for (const char* key : kSpecialTokenKeys) {
      if (!config.contains(key)) continue;
      const json& v = config[key];
      if (v.is_string()) {
        t.variables_.set(key, jinja::Value::string(v.get<std::string>()));
      } else if (v.is_object() && v.contains("content") && v["content"].is_string()) {
        t.variables_.set(key, jinja::Value::string(v["content"].get<std::string>()));
      } else if (!v.is_null()) {
        return absl::InvalidArgumentError(std::string("tokenizer_config.json: ") + key +
                                          " must be a string, an AddedToken object or null");
      }
    }
  }
  t.sort_tool_keys_ = is_kimi_tokenizer(config);
  return t;
}

absl::StatusOr<CheckpointChatTemplate> CheckpointChatTemplate::load(const fs::path& dir) {
  json config;
  const fs::path config_path = dir / "tokenizer_config.json";
  if (fs::exists(config_path)) {
    auto c = read_json(config_path);
    if (!c.ok()) return c.status();
    if (!c->is_object()) {
      return absl::InvalidArgumentError(config_path.string() + ": not a JSON object");
    }
    config = std::move(*c);
  }
  std::string source;
  std::string origin;
  if (fs::exists(dir / "chat_template.jinja")) {
    origin = (dir / "chat_template.jinja").string();
    auto text = read_file(dir / "chat_template.jinja");
    if (!text.ok()) return text.status();
    source = std::move(*text);
  } else if (fs::exists(dir / "chat_template.json")) {
    origin = (dir / "chat_template.json").string();
    auto j = read_json(dir / "chat_template.json");
    if (!j.ok()) return j.status();
    if (!j->is_object() || !j->contains("chat_template")) {
      return absl::InvalidArgumentError(origin + ": expected an object with chat_template");
    }
    auto text = template_from_config(*j, origin);
    if (!text.ok()) return text.status();
    source = std::move(*text);
  } else if (config.is_object() && config.contains("chat_template") &&
             !config["chat_template"].is_null()) {
    origin = config_path.string() + " chat_template";
    auto text = template_from_config(config, config_path.string());
    if (!text.ok()) return text.status();
    source = std::move(*text);
  } else {
    return absl::NotFoundError(dir.string() +
                               " has no chat template (chat_template.jinja, chat_template.json "
                               "or tokenizer_config.json chat_template)");
  }
  return create(source, config, origin);
}

absl::StatusOr<std::string> CheckpointChatTemplate::render(const ChatTemplateInput& input) const {
  auto r = render_tracked(input);
  if (!r.ok()) return r.status();
  return std::move(r->text);
}

absl::StatusOr<jinja::TrackedText> CheckpointChatTemplate::render_tracked(
    const ChatTemplateInput& input) const {
  if (!input.messages.is_array()) return absl::InvalidArgumentError("messages must be an array");
  if (!input.tools.is_null() && !input.tools.is_array()) {
    return absl::InvalidArgumentError("tools must be an array or null");
  }
  if (!input.kwargs.is_null() && !input.kwargs.is_object()) {
    return absl::InvalidArgumentError("chat_template_kwargs must be an object");
  }
  jinja::Dict ctx = variables_;
  if (input.kwargs.is_object()) {
    static constexpr const char* kReserved[] = {"messages",
                                                "tools",
                                                "documents",
                                                "add_generation_prompt",
                                                "conversations",
                                                "chat_template",
                                                "continue_final_message",
                                                "return_assistant_tokens_mask"};
    for (const auto& [k, v] : input.kwargs.items()) {
      if (std::find(std::begin(kReserved), std::end(kReserved), k) != std::end(kReserved)) {
        return absl::InvalidArgumentError("chat_template_kwargs may not set '" + k + "'");
      }
      ctx.set(k, jinja::from_json(v, /*from_request=*/true));
    }
  }
  ctx.set("messages", jinja::from_json(input.messages, /*from_request=*/true));
  json tools = input.tools;
  if (sort_tool_keys_ && !tools.is_null() && !tools.empty()) tools = deep_sort_keys(tools);
  ctx.set("tools", jinja::from_json(tools, /*from_request=*/true));
  ctx.set("documents", jinja::Value::none());
  ctx.set("add_generation_prompt", jinja::Value::boolean(input.add_generation_prompt));
  return template_.render_tracked(ctx);
}

namespace {

absl::Status check_apply(const ChatTemplateInput& input) {
  if (input.messages.is_array() && input.messages.empty()) {
    return absl::InvalidArgumentError(
        "Cannot apply chat template to an empty conversation. Provide at least one message.");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> CheckpointChatTemplate::apply(const ChatTemplateInput& input) const {
  if (absl::Status s = check_apply(input); !s.ok()) return s;
  return render(input);
}

absl::StatusOr<RenderedChat> CheckpointChatTemplate::apply_prompt(
    const ChatTemplateInput& input) const {
  if (absl::Status s = check_apply(input); !s.ok()) return s;
  auto r = render_tracked(input);
  if (!r.ok()) return r.status();
  RenderedChat out;
  size_t pos = 0;
  for (const auto& [b, e] : r->request_ranges) {
    if (b > pos) out.markup_ranges.emplace_back(pos, b);
    pos = e;
  }
  if (pos < r->text.size()) out.markup_ranges.emplace_back(pos, r->text.size());
  out.text = std::move(r->text);
  return out;
}

}  // namespace loom
