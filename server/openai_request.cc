#include "server/openai_request.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "engine/chat/reasoning_parser.h"
#include "nlohmann/json.hpp"
#include "server/openai_error.h"
#include "server/request_limits.h"

namespace loom {
namespace {

// Ordered: the one parse of a body gives the checks, the conversion and the template's view of
// the messages (their keys as the client wrote them) alike. Where the order of a JSON object's
// keys reaches the output or an error message, the code below uses sorted order (check_keys,
// logit_bias, the tools' schemas), which is what parsing into nlohmann::json gave.
using json = nlohmann::ordered_json;

absl::Status bad(std::string_view param, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(absl_sv(param), ": ", absl_sv(what)));
}

}  // namespace

absl::Status check_json_depth(std::string_view body) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : body) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"')
      in_string = true;
    else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) {
        return absl::InvalidArgumentError(
            absl::StrCat("JSON nests deeper than ", kMaxJsonDepth, " levels"));
      }
    } else if (c == ']' || c == '}')
      --depth;
  }
  return absl::OkStatus();
}

namespace {

absl::StatusOr<json> parse_body(std::string_view body) {
  LOOM_RETURN_IF_ERROR(check_json_depth(body));
  json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(
        "the request body is not valid JSON (or not valid UTF-8); see https://www.json.org");
  }
  if (!j.is_object()) return absl::InvalidArgumentError("the request body must be a JSON object");
  return j;
}

// Field present and not null.
const json* field(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<std::optional<int64_t>> get_int(const json& j, const char* key, int64_t lo,
                                               int64_t hi) {
  const json* v = field(j, key);
  if (!v) return std::optional<int64_t>();
  int64_t x = 0;
  if (v->is_number_integer()) {
    if (v->is_number_unsigned()) {
      uint64_t u = v->get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return bad(key, absl::StrCat("must be at most ", hi));
      }
      x = static_cast<int64_t>(u);
    } else {
      x = v->get<int64_t>();
    }
  } else if (v->is_number_float()) {
    double d = v->get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9e18) {
      return bad(key, "must be an integer");
    }
    x = static_cast<int64_t>(d);
  } else {
    return bad(key, "must be an integer");
  }
  if (x < lo) return bad(key, absl::StrCat("must be at least ", lo));
  if (x > hi) return bad(key, absl::StrCat("must be at most ", hi));
  return std::optional<int64_t>(x);
}

absl::StatusOr<std::optional<double>> get_number(const json& j, const char* key, double lo,
                                                 double hi) {
  const json* v = field(j, key);
  if (!v) return std::optional<double>();
  if (!v->is_number()) return bad(key, "must be a number");
  double d = v->get<double>();
  if (!(d >= lo && d <= hi)) return bad(key, absl::StrCat("must be in [", lo, ", ", hi, "]"));
  return std::optional<double>(d);
}

absl::StatusOr<std::optional<bool>> get_bool(const json& j, const char* key) {
  const json* v = field(j, key);
  if (!v) return std::optional<bool>();
  if (!v->is_boolean()) return bad(key, "must be a boolean");
  return std::optional<bool>(v->get<bool>());
}

#define LOOM_GET(var, expr) LOOM_ASSIGN_OR_RETURN(auto var, expr)

using Keys = std::initializer_list<std::string_view>;

// The top-level fields each endpoint reads. Any other field is a 400 naming it, as OpenAI's API
// answers; docs/api.md lists them all.
const Keys kCommonFields = {"model", "max_tokens", "temperature", "top_p", "n", "stop", "seed",
                            "presence_penalty", "frequency_penalty", "stream", "stream_options",
                            "logit_bias", "response_format", "logprobs",
                            "user",  // OpenAI's, no effect here (see check_noop_fields)
                            // Loom extensions.
                            "top_k", "min_p", "repetition_penalty", "ignore_eos", "min_tokens",
                            "priority", "parse_special_tokens", "stop_token_ids"};
const Keys kCompletionFields = {"prompt", "echo", "suffix", "best_of"};
const Keys kChatFields = {
    "messages", "tools", "tool_choice", "max_completion_tokens", "top_logprobs",
    // vLLM's: switches of the checkpoint's chat template.
    "chat_template_kwargs",
    // OpenAI's, no effect here (check_noop_fields).
    "store", "metadata", "service_tier", "safety_identifier", "prompt_cache_key", "prediction",
    "parallel_tool_calls", "modalities",
    // OpenAI's, changing the output, not implemented: rejected with a reason (reject_unsupported).
    "audio", "functions", "function_call", "reasoning_effort", "verbosity", "web_search_options"};

bool contains(Keys keys, std::string_view key) {
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

// The first key of `obj` (keys in sorted order) in none of `known`: "Unrecognized request argument
// supplied: <path>", OpenAI's words, with `param` set to the path.
absl::Status check_keys(const json& obj, std::initializer_list<Keys> known,
                        std::string_view prefix = "") {
  const std::string* first = nullptr;
  for (const auto& [key, value] : obj.items()) {
    if (std::any_of(known.begin(), known.end(), [&](Keys k) { return contains(k, key); })) continue;
    if (first == nullptr || key < *first) first = &key;
  }
  if (first != nullptr) {
    const std::string& key = *first;
    // A key is any JSON string: bound what goes back into the message.
    const std::string name = key.size() > 128 ? key.substr(0, 128) + "..." : key;
    const std::string path = prefix.empty() ? name : absl::StrCat(absl_sv(prefix), ".", name);
    return with_param(
        absl::InvalidArgumentError(absl::StrCat("Unrecognized request argument supplied: ", path)),
        path);
  }
  return absl::OkStatus();
}

absl::Status check_string(const json& j, const char* key) {
  const json* v = field(j, key);
  if (v && !v->is_string()) return bad(key, "must be a string");
  return absl::OkStatus();
}

// OpenAI fields that do not apply to Loom and would change nothing in its output: type-checked,
// then ignored.
absl::Status check_noop_fields(const json& j, bool chat) {
  LOOM_RETURN_IF_ERROR(check_string(j, "user"));  // end-user id for abuse monitoring
  if (!chat) return absl::OkStatus();
  for (const char* key : {"service_tier", "safety_identifier", "prompt_cache_key"})
    LOOM_RETURN_IF_ERROR(check_string(j, key));
  LOOM_GET(store, get_bool(j, "store"));  // Loom stores nothing
  (void)store;
  for (const char* key : {"metadata", "prediction"}) {
    const json* v = field(j, key);
    if (v && !v->is_object()) return bad(key, "must be an object");
  }
  if (const json* v = field(j, "modalities")) {
    if (*v != json::array({"text"})) return bad("modalities", "only [\"text\"] is supported");
  }
  return absl::OkStatus();
}

// OpenAI chat fields that change the output and that Loom does not implement (null: unset).
absl::Status reject_unsupported(const json& j) {
  constexpr std::pair<const char*, const char*> kUnsupported[] = {
      {"audio", "is not supported (Loom generates text only)"},
      {"functions", "is deprecated and not supported; use tools"},
      {"function_call", "is deprecated and not supported; use tool_choice"},
      {"reasoning_effort", "is not supported (Loom's models have no reasoning-effort control)"},
      {"verbosity", "is not supported (Loom's models have no verbosity control)"},
      {"web_search_options", "is not supported (Loom does no web search)"},
  };
  for (const auto& [key, why] : kUnsupported)
    if (field(j, key)) return bad(key, why);
  return absl::OkStatus();
}

absl::Status parse_stop_token_ids(const json& j, SamplingParams* p) {
  const json* v = field(j, "stop_token_ids");
  if (!v) return absl::OkStatus();
  if (!v->is_array()) return bad("stop_token_ids", "must be a list of token ids");
  if (v->size() > static_cast<size_t>(kMaxStopTokenIds))
    return bad("stop_token_ids", absl::StrCat("at most ", kMaxStopTokenIds, " token ids"));
  for (const json& t : *v) {
    // Negative and huge ids fail here; ids past the vocabulary fail SamplingParams::validate.
    if (!t.is_number_integer() || (!t.is_number_unsigned() && t.get<int64_t>() < 0) ||
        (t.is_number_unsigned() &&
         t.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()))) {
      return bad("stop_token_ids", "must be a list of token ids (integers >= 0)");
    }
    p->stop_token_ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return absl::OkStatus();
}

absl::Status parse_stop(const json& j, SamplingParams* p) {
  const json* v = field(j, "stop");
  if (!v) return absl::OkStatus();
  if (v->is_string()) {
    p->stop.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    for (const json& s : *v) {
      if (!s.is_string()) return bad("stop", "must be a string or a list of strings");
      p->stop.push_back(s.get<std::string>());
    }
  } else {
    return bad("stop", "must be a string or a list of strings");
  }
  for (const std::string& s : p->stop) {
    if (s.empty()) return bad("stop", "stop strings must not be empty");
  }
  return absl::OkStatus();
}

// Fields shared by both endpoints.
absl::Status parse_common(const json& j, OpenAiRequest* r) {
  if (const json* v = field(j, "model")) {
    if (!v->is_string()) return bad("model", "must be a string");
    r->model = v->get<std::string>();
  }
  SamplingParams& p = r->params;
  // Sampling values are read here and range-checked by SamplingParams::validate_ranges below,
  // the definition the gRPC frontend uses too.
  constexpr double kAny = std::numeric_limits<double>::max();
  LOOM_GET(temperature, get_number(j, "temperature", -kAny, kAny));
  if (temperature) p.temperature = static_cast<float>(*temperature);
  LOOM_GET(top_p, get_number(j, "top_p", -kAny, kAny));
  if (top_p) p.top_p = static_cast<float>(*top_p);
  LOOM_GET(n, get_int(j, "n", 1, kMaxN));
  if (n) p.n = static_cast<int>(*n);
  LOOM_RETURN_IF_ERROR(parse_stop(j, &p));
  LOOM_RETURN_IF_ERROR(parse_stop_token_ids(j, &p));
  if (const json* v = field(j, "seed")) {
    if (v->is_number_unsigned())
      p.seed = v->get<uint64_t>();
    else if (v->is_number_integer())
      p.seed = static_cast<uint64_t>(v->get<int64_t>());
    else
      return bad("seed", "must be an integer");
  }
  LOOM_GET(presence, get_number(j, "presence_penalty", -kAny, kAny));
  if (presence) p.presence_penalty = static_cast<float>(*presence);
  LOOM_GET(frequency, get_number(j, "frequency_penalty", -kAny, kAny));
  if (frequency) p.frequency_penalty = static_cast<float>(*frequency);
  // Loom extensions.
  LOOM_GET(top_k, get_int(j, "top_k", -1, std::numeric_limits<int32_t>::max()));
  if (top_k) p.top_k = *top_k < 0 ? 0 : static_cast<int>(*top_k);
  LOOM_GET(min_p, get_number(j, "min_p", -kAny, kAny));
  if (min_p) p.min_p = static_cast<float>(*min_p);
  LOOM_GET(rep, get_number(j, "repetition_penalty", -kAny, kAny));
  if (rep) p.repetition_penalty = static_cast<float>(*rep);
  LOOM_RETURN_IF_ERROR(p.validate_ranges());
  LOOM_GET(ignore_eos, get_bool(j, "ignore_eos"));
  if (ignore_eos) p.ignore_eos = *ignore_eos;
  LOOM_GET(min_tokens, get_int(j, "min_tokens", 0, std::numeric_limits<int32_t>::max()));
  if (min_tokens) p.min_tokens = static_cast<int>(*min_tokens);
  LOOM_GET(priority, get_int(j, "priority", -1000000, 1000000));
  if (priority) r->priority = static_cast<int32_t>(*priority);

  LOOM_GET(stream, get_bool(j, "stream"));
  r->stream = stream.value_or(false);
  if (const json* v = field(j, "stream_options")) {
    if (!v->is_object()) return bad("stream_options", "must be an object");
    if (!r->stream) return bad("stream_options", "only allowed when stream is true");
    // include_obfuscation (OpenAI's padding of stream events against length side channels):
    // Loom adds no padding, so either value is honoured.
    LOOM_RETURN_IF_ERROR(
        check_keys(*v, {{"include_usage", "include_obfuscation"}}, "stream_options"));
    for (const char* key : {"include_usage", "include_obfuscation"}) {
      const json* b = field(*v, key);
      if (b && !b->is_boolean())
        return bad(absl::StrCat("stream_options.", key), "must be a boolean");
    }
    const json* usage = field(*v, "include_usage");
    r->include_usage = usage && usage->get<bool>();
  }
  if (const json* v = field(j, "logit_bias")) {
    // {"token id": bias}: keys are decimal token ids (JSON keys are strings), biases in
    // [-100, 100]; the ids' range is checked against the vocabulary with the other params.
    if (!v->is_object()) return bad("logit_bias", "must be an object of token id -> bias");
    if (v->size() > static_cast<size_t>(kMaxLogitBias)) {
      return bad("logit_bias", absl::StrCat("at most ", kMaxLogitBias, " entries"));
    }
    // In sorted key order, as before the body was parsed ordered: the first bad key is named.
    const nlohmann::json sorted(*v);
    for (const auto& [key, bias] : sorted.items()) {
      int32_t id = -1;
      const bool digits = !key.empty() && key.size() <= 10 &&
                          key.find_first_not_of("0123456789") == std::string::npos;
      if (!digits || !absl::SimpleAtoi(key, &id)) {
        return bad("logit_bias", absl::StrCat("key `", key.substr(0, 32), "` is not a token id"));
      }
      if (!bias.is_number()) return bad("logit_bias", "biases must be numbers");
      const double b = bias.get<double>();
      if (!(b >= -kMaxLogitBiasValue && b <= kMaxLogitBiasValue)) {
        return bad("logit_bias", "biases must be in [-100, 100]");
      }
      r->params.logit_bias.emplace_back(id, static_cast<float>(b));
    }
  }
  if (const json* v = field(j, "response_format")) {
    const json* type = v->is_object() ? field(*v, "type") : nullptr;
    if (!type || !type->is_string()) return bad("response_format", "must be {\"type\": ...}");
    if (type->get<std::string>() != "text") {
      return bad("response_format", "only {\"type\": \"text\"} is supported");
    }
    LOOM_RETURN_IF_ERROR(check_keys(*v, {{"type"}}, "response_format"));
  }
  return absl::OkStatus();
}

// max_tokens (and chat's max_completion_tokens, which wins when both are given).
absl::Status parse_max_tokens(const json& j, const char* key, OpenAiRequest* r) {
  LOOM_GET(v, get_int(j, key, 1, std::numeric_limits<int32_t>::max()));
  if (v) r->max_tokens = static_cast<int>(*v);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> token_list(const json& v, std::string_view param) {
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (const json& t : v) {
    if (!t.is_number_integer()) return bad(param, "token ids must be integers");
    int64_t id = t.is_number_unsigned()
                     ? static_cast<int64_t>(std::min<uint64_t>(t.get<uint64_t>(),
                                                               std::numeric_limits<int64_t>::max()))
                     : t.get<int64_t>();
    if (id < 0 || id > std::numeric_limits<int32_t>::max()) {
      return bad(param, absl::StrCat("token id ", id, " is out of range"));
    }
    ids.push_back(static_cast<int32_t>(id));
  }
  if (ids.empty()) return bad(param, "must not be empty");
  return ids;
}

absl::Status parse_prompt(const json& j, OpenAiRequest* r) {
  const json* v = field(j, "prompt");
  if (!v) return bad("prompt", "is required");
  constexpr std::string_view kShape =
      "must be a string, a list of strings, a list of token ids or a list of token-id lists";
  if (v->is_string()) {
    r->prompts.push_back({true, v->get<std::string>(), {}});
  } else if (v->is_array()) {
    if (v->empty()) return bad("prompt", "must not be empty");
    const json& first = (*v)[0];
    if (first.is_number()) {  // one prompt of token ids: its length is the context limit's
      LOOM_ASSIGN_OR_RETURN(auto ids, token_list(*v, "prompt"));
      r->prompts.push_back({false, "", std::move(ids)});
    } else {
      if (v->size() > static_cast<size_t>(kMaxPrompts)) {
        return bad("prompt", absl::StrCat("at most ", kMaxPrompts, " prompts per request"));
      }
      for (const json& e : *v) {
        if (e.is_string()) {
          r->prompts.push_back({true, e.get<std::string>(), {}});
        } else if (e.is_array()) {
          LOOM_ASSIGN_OR_RETURN(auto ids, token_list(e, "prompt"));
          r->prompts.push_back({false, "", std::move(ids)});
        } else {
          return bad("prompt", kShape);
        }
      }
    }
  } else {
    return bad("prompt", kShape);
  }
  return absl::OkStatus();
}

// Message content: a string, or a list of {"type": "text", "text": ...} parts (concatenated).
absl::StatusOr<std::string> parse_content(const json& m, const std::string& param,
                                          bool allow_null) {
  const json* c = field(m, "content");
  if (!c) {
    if (allow_null) return std::string();
    return bad(param, "is required");
  }
  if (c->is_string()) return c->get<std::string>();
  if (!c->is_array()) return bad(param, "must be a string or a list of text parts");
  std::string out;
  for (size_t i = 0; i < c->size(); ++i) {
    const json& part = (*c)[i];
    const json* type = part.is_object() ? field(part, "type") : nullptr;
    const json* text = part.is_object() ? field(part, "text") : nullptr;
    if (!type || !type->is_string() || type->get<std::string>() != "text" || !text ||
        !text->is_string()) {
      return bad(param, "only {\"type\": \"text\", \"text\": ...} parts are supported");
    }
    LOOM_RETURN_IF_ERROR(check_keys(part, {{"type", "text"}}, absl::StrCat(param, "[", i, "]")));
    out += text->get<std::string>();
  }
  return out;
}

}  // namespace

absl::StatusOr<ChatMessage> parse_chat_message(const json& m, const std::string& param) {
  if (!m.is_object()) return bad(param, "must be an object");
  // What OpenAI's message objects may hold. An assistant reply sent back as history carries
  // "refusal": null (Loom's replies do); the deprecated function_call and audio replies only
  // as null. `reasoning_content` is vLLM's: the reasoning of an assistant reply, which
  // templates of reasoning models (Kimi-K2-Thinking's) render into history.
  LOOM_RETURN_IF_ERROR(check_keys(m,
                                  {{"role", "content", "name", "tool_call_id", "tool_calls",
                                    "refusal", "function_call", "audio", "reasoning_content"}},
                                  param));
  if (field(m, "refusal")) {
    return bad(param + ".refusal", "must be null (put a refusal's text in content)");
  }
  if (field(m, "function_call")) {
    return bad(param + ".function_call", "is deprecated and not supported; use tool_calls");
  }
  if (field(m, "audio")) return bad(param + ".audio", "is not supported (Loom is text only)");
  const json* role = field(m, "role");
  if (!role || !role->is_string()) return bad(param + ".role", "must be a string");
  ChatMessage msg;
  msg.role = role->get<std::string>();
  if (msg.role == "developer") msg.role = "system";
  if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" && msg.role != "tool") {
    return bad(param + ".role", "must be system, developer, user, assistant or tool");
  }
  if (const json* name = field(m, "name")) {
    if (!name->is_string()) return bad(param + ".name", "must be a string");
    msg.name = name->get<std::string>();
  }
  const bool assistant = msg.role == "assistant";
  LOOM_ASSIGN_OR_RETURN(msg.content, parse_content(m, param + ".content", assistant));
  // Only the checkpoint's own template sees it (template_messages); the built-in ones have no
  // place for reasoning in history (docs/chat.md).
  if (const json* reasoning = field(m, "reasoning_content")) {
    if (!assistant) {
      return bad(param + ".reasoning_content", "only assistant messages have reasoning");
    }
    if (!reasoning->is_string()) return bad(param + ".reasoning_content", "must be a string");
  }
  if (msg.role == "tool") {
    const json* id = field(m, "tool_call_id");
    if (!id || !id->is_string()) return bad(param + ".tool_call_id", "must be a string");
    msg.tool_call_id = id->get<std::string>();
  }
  if (const json* calls = field(m, "tool_calls")) {
    if (!assistant) return bad(param + ".tool_calls", "only assistant messages have tool calls");
    if (!calls->is_array()) return bad(param + ".tool_calls", "must be a list");
    for (size_t k = 0; k < calls->size(); ++k) {
      const json& c = (*calls)[k];
      std::string cp = absl::StrCat(param, ".tool_calls[", k, "]");
      const json* fn = c.is_object() ? field(c, "function") : nullptr;
      if (!fn || !fn->is_object()) return bad(cp + ".function", "must be an object");
      // `index` is accepted: streamed tool-call deltas carry it, and clients that accumulate
      // them send it back.
      LOOM_RETURN_IF_ERROR(check_keys(c, {{"id", "type", "function", "index"}}, cp));
      LOOM_RETURN_IF_ERROR(check_keys(*fn, {{"name", "arguments"}}, cp + ".function"));
      if (const json* type = field(c, "type");
          type && (!type->is_string() || type->get<std::string>() != "function")) {
        return bad(cp + ".type", "must be \"function\"");
      }
      const json* name = field(*fn, "name");
      const json* args = field(*fn, "arguments");
      if (!name || !name->is_string()) return bad(cp + ".function.name", "must be a string");
      if (!args || !args->is_string()) {
        return bad(cp + ".function.arguments", "must be a string of JSON");
      }
      ToolCall call;
      if (const json* id = field(c, "id")) {
        if (!id->is_string()) return bad(cp + ".id", "must be a string");
        call.id = id->get<std::string>();
      }
      call.name = name->get<std::string>();
      call.arguments_json = args->get<std::string>();
      msg.tool_calls.push_back(std::move(call));
    }
  }
  return msg;
}

namespace {

// `history` (null: none) goes before the body's message `at`; messages after it are numbered
// after the history's in errors, as in the body that holds them all.
absl::Status parse_messages(const json& j, OpenAiRequest* r, const ChatHistory* history,
                            size_t at) {
  const size_t kept = history != nullptr ? history->size() : 0;
  const json* v = field(j, "messages");
  if (!v) return bad("messages", "is required");
  if (!v->is_array() || (v->empty() && kept == 0))
    return bad("messages", "must be a non-empty list");
  LOOM_CHECK(at <= v->size(), "history at message %zu of %zu", at, v->size());
  r->messages.reserve(v->size() + kept);
  for (size_t i = 0; i <= v->size(); ++i) {
    if (i == at && history != nullptr) history->append_messages(&r->messages);
    if (i == v->size()) break;
    const size_t index = i < at ? i : i + kept;
    LOOM_ASSIGN_OR_RETURN(ChatMessage msg,
                          parse_chat_message((*v)[i], absl::StrCat("messages[", index, "]")));
    r->messages.push_back(std::move(msg));
  }
  return absl::OkStatus();
}

absl::Status parse_tools(const json& j, OpenAiRequest* r) {
  if (const json* v = field(j, "tools")) {
    if (!v->is_array()) return bad("tools", "must be a list");
    // The keys OpenAI's function tools have; the chat module's parser checks the shapes.
    for (size_t i = 0; i < v->size(); ++i) {
      const json& t = (*v)[i];
      if (!t.is_object()) continue;
      const std::string tp = absl::StrCat("tools[", i, "]");
      LOOM_RETURN_IF_ERROR(check_keys(t, {{"type", "function"}}, tp));
      const json* fn = field(t, "function");
      if (!fn || !fn->is_object()) continue;
      LOOM_RETURN_IF_ERROR(
          check_keys(*fn, {{"name", "description", "parameters", "strict"}}, tp + ".function"));
      if (const json* strict = field(*fn, "strict")) {
        if (!strict->is_boolean()) return bad(tp + ".function.strict", "must be a boolean");
        if (strict->get<bool>()) {
          return bad(tp + ".function.strict",
                     "true is not supported: Loom does not constrain the arguments to the schema");
        }
      }
    }
    // The schemas' keys sorted: the built-in templates print parameters_json as this gives it.
    auto tools = parse_openai_tools(nlohmann::json(*v).dump());
    if (!tools.ok()) return bad("tools", std::string(tools.status().message()));
    r->tools = std::move(tools).value();
  }
  r->tool_choice = ToolChoice::kAuto;
  if (const json* c = field(j, "tool_choice")) {
    constexpr std::string_view kUnsupported =
        "only \"none\" and \"auto\" are supported (Loom does not constrain generation to a tool)";
    if (!c->is_string()) return bad("tool_choice", kUnsupported);
    std::string s = c->get<std::string>();
    if (s == "none")
      r->tool_choice = ToolChoice::kNone;
    else if (s == "auto")
      r->tool_choice = ToolChoice::kAuto;
    else
      return bad("tool_choice", kUnsupported);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<OpenAiRequest> parse_completion_request(std::string_view body) {
  LOOM_ASSIGN_OR_RETURN(json j, parse_body(body));
  OpenAiRequest r;
  r.chat = false;
  LOOM_RETURN_IF_ERROR(check_keys(j, {kCommonFields, kCompletionFields}));
  LOOM_RETURN_IF_ERROR(check_noop_fields(j, /*chat=*/false));
  LOOM_RETURN_IF_ERROR(parse_common(j, &r));
  LOOM_RETURN_IF_ERROR(parse_prompt(j, &r));
  LOOM_GET(parse_special, get_bool(j, "parse_special_tokens"));
  r.parse_special_tokens = parse_special.value_or(true);
  LOOM_RETURN_IF_ERROR(parse_max_tokens(j, "max_tokens", &r));
  LOOM_GET(logprobs, get_int(j, "logprobs", 0, kMaxLogprobs));
  if (logprobs) {
    r.logprobs = true;
    r.top_logprobs = static_cast<int>(*logprobs);
  }
  LOOM_GET(echo, get_bool(j, "echo"));
  if (echo.value_or(false)) return bad("echo", "is not supported");
  if (const json* s = field(j, "suffix")) {
    if (!s->is_string() || !s->get<std::string>().empty()) return bad("suffix", "is not supported");
  }
  LOOM_GET(best_of, get_int(j, "best_of", 1, kMaxN));
  if (best_of && *best_of != r.params.n) return bad("best_of", "must equal n (or be omitted)");
  if (r.prompts.size() * static_cast<size_t>(r.params.n) > static_cast<size_t>(kMaxChoices)) {
    return bad("n", absl::StrCat("prompts x n must be at most ", kMaxChoices));
  }
  return r;
}

absl::StatusOr<OpenAiRequest> parse_chat_request(std::string_view body, const ChatHistory* history,
                                                 size_t history_at) {
  LOOM_ASSIGN_OR_RETURN(json j, parse_body(body));
  OpenAiRequest r;
  r.chat = true;
  LOOM_RETURN_IF_ERROR(check_keys(j, {kCommonFields, kChatFields}));
  LOOM_RETURN_IF_ERROR(check_noop_fields(j, /*chat=*/true));
  LOOM_RETURN_IF_ERROR(reject_unsupported(j));
  LOOM_RETURN_IF_ERROR(parse_common(j, &r));
  LOOM_RETURN_IF_ERROR(parse_messages(j, &r, history, history_at));
  LOOM_RETURN_IF_ERROR(parse_tools(j, &r));
  LOOM_GET(parallel, get_bool(j, "parallel_tool_calls"));
  if (parallel && !*parallel && r.parse_tools()) {
    return bad("parallel_tool_calls",
               "only true is supported: Loom cannot limit the model to one tool call per turn");
  }
  if (const json* kw = field(j, "chat_template_kwargs"); kw != nullptr && !kw->is_null()) {
    if (!kw->is_object()) return bad("chat_template_kwargs", "must be an object");
  }
  {
    // The template's view: the messages as written (keys in the client's order), moved out of
    // the body now that they are checked, with the history's in their place.
    json::array_t& body_messages = j["messages"].get_ref<json::array_t&>();
    r.template_messages = json::array();
    json::array_t& out = r.template_messages.get_ref<json::array_t&>();
    out.reserve(body_messages.size() + (history != nullptr ? history->size() : 0));
    for (size_t i = 0; i <= body_messages.size(); ++i) {
      if (i == history_at && history != nullptr)
        history->append_template_messages(&r.template_messages);
      if (i < body_messages.size()) out.push_back(std::move(body_messages[i]));
    }
    r.template_tools = j.value("tools", json());
    r.chat_template_kwargs = j.value("chat_template_kwargs", json());
  }
  LOOM_GET(parse_special, get_bool(j, "parse_special_tokens"));
  r.parse_special_tokens = parse_special.value_or(false);
  LOOM_RETURN_IF_ERROR(parse_max_tokens(j, "max_tokens", &r));
  LOOM_RETURN_IF_ERROR(parse_max_tokens(j, "max_completion_tokens", &r));
  LOOM_GET(logprobs, get_bool(j, "logprobs"));
  LOOM_GET(top, get_int(j, "top_logprobs", 0, kMaxLogprobs));
  r.logprobs = logprobs.value_or(false);
  if (top && *top > 0 && !r.logprobs) return bad("top_logprobs", "needs logprobs: true");
  r.top_logprobs = top ? static_cast<int>(*top) : 0;
  return r;
}

absl::StatusOr<RenderedChat> render_chat_request(const OpenAiRequest& req, ChatFormat format,
                                                 const CheckpointChatTemplate* chat_template,
                                                 bool* opens_reasoning) {
  LOOM_CHECK(req.chat, "render_chat_request takes a chat request");
  absl::StatusOr<RenderedChat> rendered;
  if (chat_template != nullptr) {
    ChatTemplateInput in;
    in.messages = req.template_messages;
    in.tools = req.template_tools;
    in.add_generation_prompt = true;
    in.kwargs = req.chat_template_kwargs;
    rendered = chat_template->apply_prompt(in);
    if (!rendered.ok()) {
      // A refused switch is the request's kwargs' fault; anything else the template raised is
      // about the conversation.
      const std::string m(rendered.status().message());
      return bad(
          m.starts_with("chat_template_kwargs") ? "chat_template_kwargs" : "messages",
          absl::StrCat("the model's chat template (", chat_template->origin(), "): ", absl_sv(m)));
    }
  } else {
    if (!req.chat_template_kwargs.is_null())
      return bad("chat_template_kwargs",
                 "this model has no chat template of its own; the built-in template takes no "
                 "switches");
    RenderOptions opts;
    opts.add_generation_prompt = true;
    rendered = render_chat_prompt(format, req.messages, req.tools, opts);
    if (!rendered.ok()) {
      // The renderer names the message or tool; keep its words, attribute to messages.
      std::string m(rendered.status().message());
      return bad(m.rfind("tool", 0) == 0 ? "tools" : "messages", m);
    }
  }
  if (opens_reasoning != nullptr) *opens_reasoning = prompt_opens_reasoning(rendered->text);
  return rendered;
}

std::vector<int32_t> encode_chat_text(const OpenAiRequest& req, const Tokenizer& tokenizer,
                                      const RenderedChat& rendered, size_t begin) {
  LOOM_CHECK(begin <= rendered.text.size(), "begin %zu past the text's %zu bytes", begin,
             rendered.text.size());
  const std::string_view text = std::string_view(rendered.text).substr(begin);
  if (req.parse_special_tokens) return tokenizer.encode(text, /*allow_special=*/true);
  std::vector<Tokenizer::Range> markup;
  markup.reserve(rendered.markup_ranges.size());
  for (const auto& [b, e] : rendered.markup_ranges) {
    if (e <= begin) continue;
    markup.push_back({std::max(b, begin) - begin, e - begin});
  }
  return tokenizer.encode_with_special_ranges(text, markup);
}

absl::StatusOr<Request> engine_request(const OpenAiRequest& req, std::vector<int32_t> ids,
                                       int32_t max_model_len) {
  if (ids.empty()) return bad(req.chat ? "messages" : "prompt", "encodes to no tokens");
  Request r;
  r.params = req.params;
  r.params.logprobs = req.logprobs ? req.top_logprobs : -1;
  if (req.max_tokens) {
    r.params.max_tokens = *req.max_tokens;
  } else if (!req.chat) {
    r.params.max_tokens = 16;
  } else {
    int64_t left = max_model_len > 0 ? int64_t{max_model_len} - static_cast<int64_t>(ids.size())
                                     : kDefaultChatMaxTokens;
    r.params.max_tokens = static_cast<int>(std::clamp<int64_t>(left, 1, kDefaultChatMaxTokens));
  }
  r.priority = req.priority;
  r.prompt = std::move(ids);
  return r;
}

absl::StatusOr<std::vector<Request>> build_engine_requests(
    const OpenAiRequest& req, const Tokenizer& tokenizer, ChatFormat format, int32_t max_model_len,
    const CheckpointChatTemplate* chat_template, bool* opens_reasoning) {
  std::vector<std::vector<int32_t>> prompts;
  if (opens_reasoning != nullptr) *opens_reasoning = false;
  if (req.chat) {
    LOOM_ASSIGN_OR_RETURN(RenderedChat rendered,
                          render_chat_request(req, format, chat_template, opens_reasoning));
    prompts.push_back(encode_chat_text(req, tokenizer, rendered));
  } else {
    for (const PromptInput& p : req.prompts) {
      if (p.is_text)
        prompts.push_back(tokenizer.encode(p.text, req.parse_special_tokens));
      else
        prompts.push_back(p.ids);
    }
  }
  std::vector<Request> out;
  for (auto& ids : prompts) {
    LOOM_ASSIGN_OR_RETURN(Request r, engine_request(req, std::move(ids), max_model_len));
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace loom
