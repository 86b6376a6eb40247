// ApiError: an OpenAI-shaped error ({"error": {"message", "type", "param", "code"}}) with its
// HTTP status, and the mapping from the absl::Status the parsers and the engine return.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace loom {

struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty: null
  std::string code;   // empty: null
};

// The error body (one JSON object, no trailing newline).
std::string api_error_json(const ApiError& error);

// InvalidArgument/OutOfRange -> 400, NotFound -> 404, Unauthenticated -> 401,
// ResourceExhausted -> 429, Unavailable/FailedPrecondition -> 503, anything else -> 500. `param`
// is the status's param payload (with_param) when it has one; else a message of the form
// "field: text" (field an identifier path such as "messages[2].content") sets it.
ApiError api_error_from_status(const absl::Status& status);

// `status` with `param` attached, for messages that do not start with the field's name (e.g.
// OpenAI's "Unrecognized request argument supplied: name").
absl::Status with_param(absl::Status status, std::string_view param);

ApiError make_api_error(int http_status, std::string message, std::string param = "",
                        std::string type = "");

}  // namespace loom
