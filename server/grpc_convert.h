// Conversions between the loom.v1 gRPC messages and the engine's types, and absl -> gRPC status
// mapping. Pure functions (no server state), so request validation is unit-tested without a server.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/chat/tool_call_parser.h"
#include "engine/request.h"
#include "engine/tokenizer/tokenizer.h"
#include "grpcpp/support/status.h"
#include "loom/v1/loom.pb.h"
#include "nlohmann/json.hpp"
#include "server/openai_request.h"

namespace loom {

// Builds the engine Request of a GenerateRequest: tokenizes a text prompt (`tokenizer` may be
// null: then a text prompt is FailedPrecondition), copies the sampling fields (unset optional ones
// keep SamplingParams' defaults) and validates them against `vocab_size` and `max_model_len` (0:
// no limit). InvalidArgument naming the field for anything out of range, so a bad request never
// reaches the engine.
absl::StatusOr<Request> request_from_proto(const v1::GenerateRequest& in,
                                           const Tokenizer* tokenizer, int vocab_size,
                                           int max_model_len);

// The OpenAiRequest of a ChatRequest, for prepare_chat (server/chat_request.h). The conversation
// (messages, tools, tool_choice, chat_template_kwargs) is written as the /v1/chat/completions body
// that says the same thing and read by HTTP's parser (parse_chat_request), so both frontends accept
// and refuse exactly the same conversations with the same words ("messages[1].tool_call_id: must
// be a string"); gRPC adds only "tools[i].parameters: ..." for schema text that is not JSON. The
// sampling fields are Generate's (same checks, same "sampling." messages); unset max_tokens leaves
// the chat default (the context left). InvalidArgument for anything wrong, before any work.
// A session turn: `history` (the stored conversation, kept parsed) goes before `in`'s messages,
// which alone are written and parsed (parse_chat_request's `history`).
absl::StatusOr<OpenAiRequest> chat_request_from_proto(const v1::ChatRequest& in, int vocab_size,
                                                      const ChatHistory* history = nullptr);

// The OpenAI /v1/chat/completions body the conversation of `in` (after `history`) corresponds to
// (no sampling fields). InvalidArgument when a tool's parameters or chat_template_kwargs is not
// JSON text.
absl::StatusOr<std::string> chat_body_from_proto(
    const v1::ChatRequest& in,
    const nlohmann::ordered_json& history = nlohmann::ordered_json::array());

// `in`'s messages as chat messages (OpenAI's shape, as chat_body_from_proto writes them): what a
// session keeps of the turn.
nlohmann::ordered_json chat_messages_from_proto(const v1::ChatRequest& in);

// The session fields of a ChatRequest (server/chat_session.h): session_id well formed,
// session_must_exist and store only with it. InvalidArgument naming the field.
absl::Status check_chat_session_fields(const v1::ChatRequest& in);

// INVALID_ARGUMENT naming the first field of `message` or of a message inside it (sampling,
// token_ids, map entries) that this server's loom.v1 does not know: a newer client's field, which
// would otherwise be dropped without a word. "sampling: unknown field number 17 ...".
absl::Status check_no_unknown_fields(const google::protobuf::Message& message);

// One engine event as a GenerateResponse.
void response_from_output(const RequestOutput& out, v1::GenerateResponse* resp);

// One engine event of a Chat choice as a ChatResponse: the tokens, logprobs and usage as in
// Generate, the text as `delta` (what the choice's ChatReplyReader made of it). A choice that
// stopped after making tool calls finishes with FINISH_REASON_TOOL_CALLS.
void chat_response_from_output(const RequestOutput& out, const ChatDelta& delta,
                               bool made_tool_calls, v1::ChatResponse* resp);

v1::FinishReason finish_reason_to_proto(FinishReason reason);

// absl::Status -> grpc::Status with the same canonical code and message.
grpc::Status to_grpc_status(const absl::Status& status);

}  // namespace loom
