// Chat templates written as code: renders an OpenAI-style conversation (messages + tool
// definitions) into the prompt text a model family was trained on, with special-token strings
// spelled out (e.g. "<|im_start|>"). render_chat_prompt also says which bytes the template wrote:
// the tokenizer matches special tokens only there (Tokenizer::encode_with_special_ranges), so
// message content, names, ids and tool JSON cannot forge a turn or an end of text.
// Formats and the upstream templates they reproduce are described in docs/chat.md.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace loom {

enum class ChatFormat {
  kKimi,      // Kimi-K2 / Kimi-Linear: <|im_user|>user<|im_middle|>...<|im_end|>
  kDeepSeek,  // DeepSeek-V3: <｜begin▁of▁sentence｜>...<｜User｜>...<｜Assistant｜>
  kQwen,      // Qwen3 / Qwen3-Next: <|im_start|>role\n...<|im_end|>\n
  kNative,    // Loom's own format (docs/chat.md)
};

// "kimi", "deepseek", "qwen" or "native".
std::string_view chat_format_name(ChatFormat format);

// Maps config.json's model_type to its chat format: kimi_linear/kimi_k2 -> kimi,
// deepseek_v3 -> deepseek, qwen3_next/qwen3/qwen3_moe -> qwen, kda/loom and anything else ->
// native.
ChatFormat chat_format_for_model_type(std::string_view model_type);

// One tool call of an assistant message (OpenAI `tool_calls[i]`).
struct ToolCall {
  std::string id;              // e.g. "call_0" or Kimi's "functions.get_weather:0"
  std::string name;            // function name
  std::string arguments_json;  // the arguments object as JSON text, rendered verbatim
};

// One message of an OpenAI chat request.
struct ChatMessage {
  std::string role;  // "system", "user", "assistant" or "tool"
  std::string content;
  std::vector<ToolCall> tool_calls;  // assistant only
  std::string tool_call_id;          // tool only: the call this message answers
  std::string name;                  // optional; Kimi puts it in the turn header
};

// One entry of OpenAI `tools` ({"type": "function", "function": {...}}).
struct ToolDefinition {
  std::string name;
  std::string description;      // may be empty (then omitted)
  std::string parameters_json;  // JSON Schema object as JSON text; may be empty (then omitted)
};

struct RenderOptions {
  // Append the header of a new assistant turn so the model generates the reply.
  bool add_generation_prompt = true;
};

// Parses an OpenAI `tools` array. InvalidArgument naming the entry when it is not an array of
// {"type": "function", "function": {"name": ..., ...}} objects.
absl::StatusOr<std::vector<ToolDefinition>> parse_openai_tools(std::string_view tools_json);

// A rendered prompt: its text, and the byte ranges [first, second) of `text` that are template
// markup (sorted, non-overlapping). Everything outside them came from the request.
struct RenderedChat {
  std::string text;
  std::vector<std::pair<size_t, size_t>> markup_ranges;
};

// Renders the conversation. InvalidArgument (naming the message or tool) on an unknown role, a
// tool definition without a name or with malformed parameters JSON, or a tool call whose
// arguments are not valid JSON. Thread-safe (pure function).
absl::StatusOr<std::string> render_chat(ChatFormat format, const std::vector<ChatMessage>& messages,
                                        const std::vector<ToolDefinition>& tools,
                                        const RenderOptions& options);
// The same, with the markup ranges. A prompt for a model must be encoded with special tokens
// matched only inside them; encoding the plain text with special tokens allowed lets a user
// message close its turn and open a system one.
absl::StatusOr<RenderedChat> render_chat_prompt(ChatFormat format,
                                                const std::vector<ChatMessage>& messages,
                                                const std::vector<ToolDefinition>& tools,
                                                const RenderOptions& options);

// The end-of-turn marker `format` writes after an assistant message ("<|end|>" for native,
// "<|im_end|>" for qwen), found by rendering a one-turn conversation. A reply ends there: the
// trainer's evaluations cut replies at it, and loom-server stops a chat reply at it when the
// model's tokenizer spells it as text rather than as one special token.
absl::StatusOr<std::string> end_of_turn_marker(ChatFormat format);

}  // namespace loom
