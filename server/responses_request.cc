#include "server/responses_request.h"

#include <algorithm>
#include <initializer_list>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "server/openai_error.h"
#include "server/openai_request.h"

namespace loom {
namespace {

using ojson = nlohmann::ordered_json;

absl::Status bad(std::string_view param, std::string_view what) {
  return with_param(absl::InvalidArgumentError(absl::StrCat(absl_sv(param), ": ", absl_sv(what))),
                    param);
}

const ojson* field(const ojson& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

// Fields passed through to the chat request unchanged: the chat parser checks them. The Loom
// extensions are the chat endpoint's (docs/api.md).
constexpr std::string_view kPassThrough[] = {"model",
                                             "temperature",
                                             "top_p",
                                             "parallel_tool_calls",
                                             "seed",
                                             "top_k",
                                             "min_p",
                                             "repetition_penalty",
                                             "ignore_eos",
                                             "min_tokens",
                                             "priority",
                                             "chat_template_kwargs",
                                             "user",
                                             "safety_identifier",
                                             "prompt_cache_key",
                                             "service_tier"};
// Read here.
constexpr std::string_view kOwn[] = {"input",          "instructions", "previous_response_id",
                                     "store",          "stream",       "max_output_tokens",
                                     "tools",          "tool_choice",  "metadata",
                                     "text",           "truncation",   "reasoning",
                                     "include",        "background",   "top_logprobs",
                                     "max_tool_calls", "prompt",       "conversation",
                                     "stream_options"};

template <size_t N>
bool listed(const std::string_view (&keys)[N], std::string_view key) {
  return std::find(std::begin(keys), std::end(keys), key) != std::end(keys);
}

// Text of a message's content: a string, or a list of input_text / output_text parts.
absl::StatusOr<std::string> content_text(const ojson& content, const std::string& param) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return bad(param, "must be a string or a list of text parts");
  std::string out;
  for (size_t i = 0; i < content.size(); ++i) {
    const ojson& part = content[i];
    const std::string pp = absl::StrCat(param, "[", i, "]");
    const ojson* type = part.is_object() ? field(part, "type") : nullptr;
    const ojson* text = part.is_object() ? field(part, "text") : nullptr;
    if (!type || !type->is_string()) return bad(pp + ".type", "must be a string");
    const std::string t = type->get<std::string>();
    if (t != "input_text" && t != "output_text") {
      return bad(pp + ".type",
                 absl::StrCat("'", t.substr(0, 64),
                              "' is not supported: only input_text and output_text parts (Loom's "
                              "models read text only)"));
    }
    if (!text || !text->is_string()) return bad(pp + ".text", "must be a string");
    for (const auto& [key, value] : part.items()) {
      // output_text parts sent back carry annotations (and logprobs); they say nothing new.
      if (key != "type" && key != "text" && key != "annotations" && key != "logprobs")
        return bad(absl::StrCat(pp, ".", key.substr(0, 64)), "Unrecognized argument");
    }
    out += text->get<std::string>();
  }
  return out;
}

// The input items as chat messages. Function calls join the assistant message before them (the
// reply they came with), as the chat API writes one assistant message with content and calls.
absl::Status input_messages(const ojson& input, ojson* out) {
  if (input.is_string()) {
    out->push_back({{"role", "user"}, {"content", input.get<std::string>()}});
    return absl::OkStatus();
  }
  if (!input.is_array() || input.empty()) {
    return bad("input", "must be a string or a non-empty list of input items");
  }
  for (size_t i = 0; i < input.size(); ++i) {
    const ojson& item = input[i];
    const std::string param = absl::StrCat("input[", i, "]");
    if (!item.is_object()) return bad(param, "must be an object");
    std::string type = "message";
    if (const ojson* t = field(item, "type")) {
      if (!t->is_string()) return bad(param + ".type", "must be a string");
      type = t->get<std::string>();
    }
    auto check_keys = [&](std::initializer_list<std::string_view> keys) -> absl::Status {
      for (const auto& [key, value] : item.items()) {
        if (std::find(keys.begin(), keys.end(), key) == keys.end())
          return bad(absl::StrCat(param, ".", key.substr(0, 64)), "Unrecognized argument");
      }
      return absl::OkStatus();
    };
    auto string_field = [&](const char* key) -> absl::StatusOr<std::string> {
      const ojson* v = field(item, key);
      if (!v || !v->is_string()) return bad(absl::StrCat(param, ".", key), "must be a string");
      return v->get<std::string>();
    };
    if (type == "message") {
      LOOM_RETURN_IF_ERROR(check_keys({"type", "role", "content", "id", "status"}));
      LOOM_ASSIGN_OR_RETURN(std::string role, string_field("role"));
      if (role != "user" && role != "system" && role != "developer" && role != "assistant") {
        return bad(param + ".role", "must be user, system, developer or assistant");
      }
      const ojson* content = field(item, "content");
      if (!content) return bad(param + ".content", "is required");
      LOOM_ASSIGN_OR_RETURN(std::string text, content_text(*content, param + ".content"));
      out->push_back({{"role", role}, {"content", std::move(text)}});
    } else if (type == "function_call") {
      LOOM_RETURN_IF_ERROR(check_keys({"type", "call_id", "name", "arguments", "id", "status"}));
      LOOM_ASSIGN_OR_RETURN(std::string call_id, string_field("call_id"));
      LOOM_ASSIGN_OR_RETURN(std::string name, string_field("name"));
      LOOM_ASSIGN_OR_RETURN(std::string arguments, string_field("arguments"));
      ojson call = {{"id", call_id},
                    {"type", "function"},
                    {"function", {{"name", name}, {"arguments", arguments}}}};
      const bool joins = !out->empty() && out->back().value("role", "") == "assistant";
      if (!joins) out->push_back({{"role", "assistant"}, {"content", ""}});
      ojson& msg = out->back();
      if (!msg.contains("tool_calls")) msg["tool_calls"] = ojson::array();
      msg["tool_calls"].push_back(std::move(call));
    } else if (type == "function_call_output") {
      LOOM_RETURN_IF_ERROR(check_keys({"type", "call_id", "output", "id", "status"}));
      LOOM_ASSIGN_OR_RETURN(std::string call_id, string_field("call_id"));
      const ojson* output = field(item, "output");
      if (!output) return bad(param + ".output", "is required");
      LOOM_ASSIGN_OR_RETURN(std::string text, content_text(*output, param + ".output"));
      out->push_back({{"role", "tool"}, {"tool_call_id", call_id}, {"content", std::move(text)}});
    } else {
      return bad(param + ".type",
                 absl::StrCat("'", type.substr(0, 64),
                              "' is not supported: input items are message, function_call and "
                              "function_call_output (continue a conversation with "
                              "previous_response_id)"));
    }
  }
  return absl::OkStatus();
}

// Responses function tools ({"type": "function", "name", ...}) as chat tools.
absl::Status tools(const ojson& j, ResponsesRequest* r) {
  const ojson* v = field(j, "tools");
  if (!v) return absl::OkStatus();
  if (!v->is_array()) return bad("tools", "must be a list");
  ojson chat_tools = ojson::array();
  for (size_t i = 0; i < v->size(); ++i) {
    const ojson& t = (*v)[i];
    const std::string param = absl::StrCat("tools[", i, "]");
    if (!t.is_object()) return bad(param, "must be an object");
    const ojson* type = field(t, "type");
    if (!type || !type->is_string() || type->get<std::string>() != "function") {
      return bad(param + ".type",
                 "only function tools are supported (Loom runs no built-in tools: web search, "
                 "file search, code interpreter, ...)");
    }
    ojson fn = ojson::object();
    for (const auto& [key, value] : t.items()) {
      if (key == "type") continue;
      if (key != "name" && key != "description" && key != "parameters" && key != "strict")
        return bad(absl::StrCat(param, ".", key.substr(0, 64)), "Unrecognized argument");
      fn[key] = value;
    }
    // OpenAI's Responses API makes function tools strict unless told otherwise; Loom does not
    // constrain arguments, so only an explicit false (or leaving it out) is accepted as "not
    // strict" here and the chat parser refuses true.
    chat_tools.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  r->tools = *v;
  r->chat_fields["tools"] = std::move(chat_tools);
  return absl::OkStatus();
}

absl::Status unsupported(const ojson& j) {
  if (const ojson* v = field(j, "background"); v && *v != false)
    return bad("background", "true is not supported (Loom answers while the client waits)");
  if (const ojson* v = field(j, "reasoning"); v && !(v->is_object() && v->empty()))
    return bad("reasoning", "is not supported (Loom's models have no reasoning-effort control)");
  if (const ojson* v = field(j, "include"); v && !(v->is_array() && v->empty()))
    return bad("include", "is not supported (Loom has nothing extra to include)");
  if (const ojson* v = field(j, "truncation"); v && *v != "disabled")
    return bad("truncation",
               "only \"disabled\" is supported: a conversation past the context fails with 400");
  if (const ojson* v = field(j, "text")) {
    const ojson* format = v->is_object() ? field(*v, "format") : nullptr;
    const bool text_only = v->is_object() && v->size() <= 1 &&
                           (format == nullptr || (format->is_object() && format->size() == 1 &&
                                                  format->value("type", "") == "text"));
    if (!text_only) {
      return bad("text",
                 "only {\"format\": {\"type\": \"text\"}} is supported (no JSON schema "
                 "or verbosity control)");
    }
  }
  if (const ojson* v = field(j, "top_logprobs"); v && *v != 0)
    return bad("top_logprobs", "is not supported on /v1/responses (use /v1/chat/completions)");
  if (field(j, "max_tool_calls"))
    return bad("max_tool_calls", "is not supported (Loom cannot bound the model's tool calls)");
  if (field(j, "prompt")) return bad("prompt", "prompt templates are not supported");
  if (field(j, "conversation"))
    return bad("conversation",
               "the Conversations API is not supported; continue with previous_response_id");
  if (field(j, "stream_options"))
    return bad("stream_options", "is not supported (usage is in response.completed)");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ResponsesRequest> parse_responses_request(std::string_view body) {
  LOOM_RETURN_IF_ERROR(check_json_depth(body));
  const ojson j = ojson::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(
        "the request body is not valid JSON (or not valid UTF-8); see https://www.json.org");
  }
  if (!j.is_object()) return absl::InvalidArgumentError("the request body must be a JSON object");
  for (const auto& [key, value] : j.items()) {
    if (listed(kPassThrough, key) || listed(kOwn, key)) continue;
    const std::string name = key.size() > 128 ? key.substr(0, 128) + "..." : key;
    return with_param(
        absl::InvalidArgumentError(absl::StrCat("Unrecognized request argument supplied: ", name)),
        name);
  }
  LOOM_RETURN_IF_ERROR(unsupported(j));
  ResponsesRequest r;
  for (const auto& [key, value] : j.items()) {
    if (listed(kPassThrough, key) && !value.is_null()) r.chat_fields[key] = value;
  }
  const ojson* input = field(j, "input");
  if (!input) return bad("input", "is required");
  LOOM_RETURN_IF_ERROR(input_messages(*input, &r.input_messages));
  if (const ojson* v = field(j, "instructions")) {
    if (!v->is_string()) return bad("instructions", "must be a string");
    r.instructions = v->get<std::string>();
  }
  if (const ojson* v = field(j, "previous_response_id")) {
    if (!v->is_string() || v->get<std::string>().empty())
      return bad("previous_response_id", "must be a non-empty string");
    r.previous_response_id = v->get<std::string>();
  }
  if (const ojson* v = field(j, "store")) {
    if (!v->is_boolean()) return bad("store", "must be a boolean");
    r.store = v->get<bool>();
  }
  if (const ojson* v = field(j, "stream")) {
    if (!v->is_boolean()) return bad("stream", "must be a boolean");
    r.stream = v->get<bool>();
  }
  if (const ojson* v = field(j, "max_output_tokens")) {
    if (!v->is_number_integer() ||
        (v->is_number_unsigned() ? v->get<uint64_t>() < 1 : v->get<int64_t>() < 1))
      return bad("max_output_tokens", "must be an integer >= 1");
    r.max_output_tokens =
        v->is_number_unsigned()
            ? static_cast<int64_t>(std::min<uint64_t>(v->get<uint64_t>(), 1u << 30))
            : v->get<int64_t>();
    r.chat_fields["max_tokens"] = *r.max_output_tokens;
  }
  if (const ojson* v = field(j, "metadata")) {
    if (!v->is_object()) return bad("metadata", "must be an object");
    if (v->size() > 16) return bad("metadata", "at most 16 keys");
    for (const auto& [key, value] : v->items()) {
      if (!value.is_string()) return bad("metadata", "values must be strings");
    }
    r.metadata = *v;
  }
  LOOM_RETURN_IF_ERROR(tools(j, &r));
  if (const ojson* v = field(j, "tool_choice")) {
    if (!v->is_string() || (*v != "auto" && *v != "none")) {
      return bad("tool_choice",
                 "only \"none\" and \"auto\" are supported (Loom does not constrain generation to "
                 "a tool)");
    }
    r.tool_choice = v->get<std::string>();
    r.chat_fields["tool_choice"] = r.tool_choice;
  }
  if (const ojson* v = field(j, "temperature"); v && v->is_number())
    r.temperature = v->get<double>();
  if (const ojson* v = field(j, "top_p"); v && v->is_number()) r.top_p = v->get<double>();
  // Everything else (types, ranges, the tools' schemas, the template's view of the conversation)
  // is the chat parser's: check it now, with this turn's messages alone, so that a bad request
  // fails before a stored conversation is looked up.
  LOOM_RETURN_IF_ERROR(parse_chat_request(responses_chat_body(r, ojson::array())).status());
  return r;
}

std::string responses_chat_body(const ResponsesRequest& req, const ojson& history) {
  ojson body = req.chat_fields;
  ojson messages = ojson::array();
  if (req.instructions) messages.push_back({{"role", "system"}, {"content", *req.instructions}});
  for (const ojson& m : history) messages.push_back(m);
  for (const ojson& m : req.input_messages) messages.push_back(m);
  body["messages"] = std::move(messages);
  return body.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

}  // namespace loom
