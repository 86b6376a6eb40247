// A checkpoint's own chat template (Jinja), rendered as Hugging Face transformers renders it
// (`apply_chat_template(tokenize=False)`): the template from `chat_template.jinja` (or
// `chat_template.json`, or `tokenizer_config.json`'s `chat_template`: a string, or a list of
// named templates of which "default" is used), the special-token variables of
// tokenizer_config.json (bos_token, eos_token, unk_token, sep_token, pad_token, cls_token,
// mask_token: strings or AddedToken objects), and the tokenizer's own preprocessing where its
// code does one (Kimi's TikTokenTokenizer sorts the keys of every dict in `tools`, recursively).
// The template always sees `messages`, `tools` and `documents` (None when absent),
// `add_generation_prompt`, the variables and the request's `chat_template_kwargs`.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/chat/chat_template.h"
#include "engine/chat/jinja_render.h"
#include "nlohmann/json.hpp"

namespace loom {

struct ChatTemplateInput {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // OpenAI messages
  nlohmann::ordered_json tools;  // array of tool definitions, or null
  bool add_generation_prompt = false;
  nlohmann::ordered_json
      kwargs;  // object of extra template variables (chat_template_kwargs), or null
};

class CheckpointChatTemplate {
 public:
  // Reads `dir`: chat_template.jinja, else chat_template.json, else tokenizer_config.json's
  // chat_template; variables and the tool preprocessing from tokenizer_config.json (optional).
  // NotFound when the folder has no template; InvalidArgument naming the file on a malformed
  // one or a template that does not parse.
  static absl::StatusOr<CheckpointChatTemplate> load(const std::filesystem::path& dir);

  // From the template text and a tokenizer_config.json object (may be null). `origin` names
  // where the text came from, for messages and logs.
  static absl::StatusOr<CheckpointChatTemplate> create(
      std::string_view source, const nlohmann::ordered_json& tokenizer_config,
      std::string origin = "chat template");

  // As transformers' render_jinja_template (with the tokenizer's tool preprocessing applied
  // first): the template's text for this conversation. InvalidArgument naming the problem and
  // the template line on a template error (raise_exception included), or on malformed input.
  absl::StatusOr<std::string> render(const ChatTemplateInput& input) const;

  // As apply_chat_template(tokenize=False): render() after its checks (an empty conversation is
  // refused).
  absl::StatusOr<std::string> apply(const ChatTemplateInput& input) const;

  // apply(), with the byte ranges the template itself wrote (RenderedChat::markup_ranges): the
  // text minus what came from the request (messages, tools, kwargs). A string the template
  // computed from request text with a filter or method (split, strip, tojson, ...) counts as
  // request text as a whole; concatenation and printing keep exact ranges. Encoding the text with
  // Tokenizer::encode_with_special_ranges(markup_ranges) keeps request text from spelling special
  // tokens, as with the per-family templates.
  absl::StatusOr<RenderedChat> apply_prompt(const ChatTemplateInput& input) const;

  const std::string& source() const { return source_; }
  const std::string& origin() const { return origin_; }
  // The special-token variables passed to the template.
  const jinja::Dict& variables() const { return variables_; }
  // Whether `tools` is deep-sorted before rendering (Kimi tokenizers).
  bool sorts_tool_keys() const { return sort_tool_keys_; }

 private:
  absl::StatusOr<jinja::TrackedText> render_tracked(const ChatTemplateInput& input) const;

  std::string source_;
  std::string origin_;
  jinja::Dict variables_;
  bool sort_tool_keys_ = false;
  jinja::Template template_;
};

// Kimi's deep_sort_dict: the same JSON with every object's keys sorted, recursively.
nlohmann::ordered_json deep_sort_keys(const nlohmann::ordered_json& value);

}  // namespace loom
