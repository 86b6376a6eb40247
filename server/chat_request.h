// What every frontend does with a chat request once it is parsed into an OpenAiRequest (HTTP's
// /v1/chat/completions body, gRPC's loom.v1.ChatRequest: server/grpc_convert.h): the prompt is
// rendered and tokenized with the server's ChatSetup (prepare_chat), and each choice's streamed
// reply is read with the chat module's parsers (ChatReplyReader). One code path, so the two
// frontends cannot drift: the same template, the same tool-call and reasoning parsers, the same
// errors.
#pragma once

#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/chat/chat_output_parser.h"
#include "engine/request.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/chat_setup.h"
#include "server/conversation_tokens.h"
#include "server/openai_request.h"

namespace loom {

// A chat request ready to submit.
struct PreparedChat {
  Request request;           // the rendered, tokenized prompt and the sampling parameters
  ChatOutputOptions output;  // how its replies are read (reasoning, tool-call syntax)
  // With keep_prompt: the prompt's rendered text and its ids (ConversationTurn::prompt).
  std::shared_ptr<const ConversationTokens> prompt;
  size_t encoded_bytes = 0;  // bytes of the rendering the tokenizer was given
  bool continued = false;    // the prompt is `continues`'s ids and the new text's
};

// Renders and tokenizes `req` (a chat request) with `chat`'s template (build_engine_requests) and
// decides how its replies are read: reasoning split off when `chat` says so, tool calls parsed when
// the request has tools and tool_choice "auto". InvalidArgument ("messages: ...", "tools: ...")
// when the template refuses the conversation. The engine checks prompt + max_tokens against its
// context limit when the request is submitted (the same error on every frontend).
// `continues` (a kept conversation's ids and text, or null): when the rendering continues its
// text, only the rest is tokenized and the prompt is its ids followed by the rest's
// (split_conversation, server/conversation_tokens.h); otherwise the whole rendering is.
absl::StatusOr<PreparedChat> prepare_chat(const OpenAiRequest& req, const Tokenizer& tokenizer,
                                          const ChatSetup& chat, int32_t max_model_len,
                                          const ConversationTokens* continues = nullptr,
                                          bool keep_prompt = false);

// One choice's streamed reply: its engine events in, what the client sees out. Not thread-safe;
// one per choice.
class ChatReplyReader {
 public:
  // Parses when `output` asks for reasoning or tool calls; otherwise the text is the content.
  explicit ChatReplyReader(const ChatOutputOptions& output);

  // The reply's next piece: `out.text` read by the parsers and, on the choice's final event, what
  // they held back.
  ChatDelta feed(const RequestOutput& out);
  // Whether any delta so far carried a tool call.
  bool made_tool_calls() const { return made_tool_calls_; }

 private:
  std::optional<ChatOutputParser> parser_;
  bool made_tool_calls_ = false;
  bool finished_ = false;
};

// A chat choice's finish reason as OpenAI names it: "tool_calls" when it stopped (EOS, stop
// token or string) after making tool calls, else finish_reason_name(reason).
std::string_view chat_finish_reason(FinishReason reason, bool made_tool_calls);

}  // namespace loom
