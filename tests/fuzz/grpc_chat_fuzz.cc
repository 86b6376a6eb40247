// Fuzzes the gRPC frontend's Chat converter (server/grpc_convert.cc): any bytes as a
// loom.v1.ChatRequest, then (when they parse) chat_request_from_proto, which writes the
// conversation as a /v1/chat/completions body for HTTP's parser (schema and kwargs text spliced in
// verbatim), and prepare_chat with the byte-level tokenizer and every built-in chat format.
// Nothing may crash, hang or leak; every refusal is a client error (HTTP 400, gRPC
// INVALID_ARGUMENT); accepted requests satisfy what the parser promises.
#include <cstddef>
#include <cstdint>

#include "core/status.h"
#include "server/chat_request.h"
#include "server/grpc_convert.h"
#include "server/openai_error.h"

namespace {

const loom::Tokenizer& tokenizer() {
  static const auto* tok = loom::Tokenizer::byte_level().release();
  return *tok;
}

constexpr int kVocab = 260;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1 << 16)) return 0;
  loom::v1::ChatRequest in;
  if (!in.ParseFromArray(data, static_cast<int>(size))) return 0;
  absl::StatusOr<loom::OpenAiRequest> req = loom::chat_request_from_proto(in, kVocab);
  if (!req.ok()) {
    LOOM_CHECK(req.status().code() == absl::StatusCode::kInvalidArgument, "%s",
               req.status().ToString().c_str());
    LOOM_CHECK(loom::api_error_from_status(req.status()).http_status == 400);
    return 0;
  }
  LOOM_CHECK(req->chat && !req->messages.empty());
  LOOM_CHECK(req->params.n >= 1 && req->params.n <= loom::kMaxN);
  LOOM_CHECK(!req->max_tokens || *req->max_tokens >= 1);
  loom::ChatSetup chat;
  chat.format = static_cast<loom::ChatFormat>(size % 4);
  chat.tool_call_syntax = loom::default_tool_call_syntax(chat.format);
  absl::StatusOr<loom::PreparedChat> prepared = loom::prepare_chat(*req, tokenizer(), chat, 4096);
  if (prepared.ok()) {
    LOOM_CHECK(!prepared->request.prompt.empty());
    LOOM_CHECK(prepared->request.params.max_tokens >= 1);
    LOOM_CHECK(prepared->output.tool_calls.has_value() == req->parse_tools());
  } else {
    LOOM_CHECK(loom::api_error_from_status(prepared.status()).http_status == 400, "%s",
               prepared.status().ToString().c_str());
  }
  return 0;
}
