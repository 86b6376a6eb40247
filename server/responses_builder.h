// ResponsesBuilder: one /v1/responses turn's engine events -> OpenAI's Response object
// (non-streaming) or its server-sent events (response.created, response.in_progress,
// response.output_item.added, response.content_part.added, response.output_text.delta, ...,
// response.function_call_arguments.delta, ..., response.output_item.done, response.completed),
// each with its sequence_number. The reply is read with ChatReplyReader, the chat endpoints'
// parsers (server/chat_request.h). When the turn completes (stop or length) and the request said
// store, the response and its conversation are kept (ConversationTurn::record, the mechanism gRPC
// sessions share) before the last event is handed out, so a client that continues at once finds it.
// Not thread-safe: one per request.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "server/chat_request.h"
#include "server/chat_session.h"
#include "server/response_renderer.h"
#include "server/response_store.h"

namespace loom {

struct ResponsesTurn {
  std::string id;  // "resp_..."
  int64_t created_at = 0;
  std::string model;
  ChatOutputOptions output;
  // Echoed fields of the Response object (instructions, previous_response_id, store, tools,
  // tool_choice, temperature, top_p, max_output_tokens, metadata, ...).
  nlohmann::ordered_json echo = nlohmann::ordered_json::object();
  // Where the conversation is kept under the response id (server/chat_session.h); its null store:
  // store false.
  ConversationTurn kept;
};

class ResponsesBuilder : public ResponseRenderer {
 public:
  ResponsesBuilder(ResponsesTurn turn, bool stream);

  // Streaming: response.created and response.in_progress (sent before any engine event).
  std::vector<std::string> stream_head();
  std::vector<std::string> on_event(int prompt, const RequestOutput& out) override;
  std::vector<std::string> stream_tail() const override { return {}; }
  std::string final_json() const override;
  const std::string& error() const override { return error_; }
  int prompt_tokens() const override { return prompt_tokens_; }
  int completion_tokens() const override { return completion_tokens_; }
  const std::string& last_finish_reason() const override { return reason_; }
  // `event: <type>` + `data: <json>`; the stream ends with response.completed (no [DONE]).
  std::string sse_frame(const std::string& payload) const override;
  std::string sse_end() const override { return ""; }

  // The Response object as it stands ("in_progress" until the last event).
  nlohmann::ordered_json response() const;

 private:
  struct Item;  // one output item: message, function call or reasoning
  std::string event(nlohmann::ordered_json e);
  void open_message(std::vector<std::string>* out);
  void close_open(std::vector<std::string>* out);

  ResponsesTurn turn_;
  bool stream_;
  ChatReplyReader reader_;
  std::string status_ = "in_progress";
  std::string reason_;
  std::string error_;
  int prompt_tokens_ = 0, completion_tokens_ = 0, cached_tokens_ = 0;
  int64_t sequence_ = 0;
  std::vector<nlohmann::ordered_json> items_;  // output items, final shape as far as known
  int message_ = -1;                           // index in items_ of the open message, if any
  std::vector<int> calls_;                     // items_ index of tool call k (parser's index)
  std::string text_, reasoning_;
  ReplyTranscript transcript_;  // the reply as the next turn's assistant message
};

}  // namespace loom
