// Fuzzes the HTTP frontend's request parsers: any bytes as a /v1/completions and a
// /v1/chat/completions body, then (when accepted) the translation into engine requests with the
// byte-level tokenizer and every chat format, and the error mapping. Nothing may crash, hang or
// leak; accepted requests must satisfy the limits the parser promises.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/status.h"
#include "server/openai_error.h"
#include "server/openai_request.h"

namespace {

const loom::Tokenizer& tokenizer() {
  static const auto* tok = loom::Tokenizer::byte_level().release();
  return *tok;
}

void exercise(const absl::StatusOr<loom::OpenAiRequest>& req, loom::ChatFormat format) {
  if (!req.ok()) {
    loom::ApiError e = loom::api_error_from_status(req.status());
    LOOM_CHECK(e.http_status == 400, "parser error mapped to %d", e.http_status);
    (void)loom::api_error_json(e);
    return;
  }
  LOOM_CHECK(req->params.n >= 1 && req->params.n <= loom::kMaxN);
  LOOM_CHECK(!req->max_tokens || *req->max_tokens >= 1);
  LOOM_CHECK(req->chat ? !req->messages.empty() : !req->prompts.empty());
  auto built = loom::build_engine_requests(*req, tokenizer(), format, 4096);
  if (built.ok()) {
    for (const loom::Request& r : *built) {
      LOOM_CHECK(!r.prompt.empty());
      LOOM_CHECK(r.params.max_tokens >= 1);
    }
  } else {
    (void)loom::api_error_json(loom::api_error_from_status(built.status()));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1 << 16)) return 0;
  std::string_view body(reinterpret_cast<const char*>(data), size);
  const loom::ChatFormat format = static_cast<loom::ChatFormat>(size % 4);
  exercise(loom::parse_completion_request(body), format);
  exercise(loom::parse_chat_request(body), format);
  return 0;
}
