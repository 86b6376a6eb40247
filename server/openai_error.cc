#include "server/openai_error.h"

#include <cctype>
#include <utility>

#include "absl/strings/cord.h"
#include "nlohmann/json.hpp"

namespace loom {
namespace {

constexpr char kParamPayload[] = "type.loom.dev/param";

std::string default_type(int status) {
  switch (status) {
    case 400:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 404:
      return "not_found_error";
    case 429:
      return "rate_limit_error";
    case 503:
      return "service_unavailable";
    default:
      return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

// "field: message" (the request parsers) or "field = value: expected ..." (SamplingParams::
// validate) -> "field" when the prefix looks like a parameter path.
std::string param_of(std::string_view message) {
  size_t colon = message.find(": ");
  if (colon == std::string_view::npos) return "";
  if (size_t eq = message.find(" = "); eq != std::string_view::npos && eq < colon) colon = eq;
  if (colon == 0 || colon > 64) return "";
  for (char c : message.substr(0, colon)) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '[' ||
          c == ']'))
      return "";
  }
  return std::string(message.substr(0, colon));
}

}  // namespace

ApiError make_api_error(int http_status, std::string message, std::string param, std::string type) {
  ApiError e;
  e.http_status = http_status;
  e.message = std::move(message);
  e.param = std::move(param);
  e.type = type.empty() ? default_type(http_status) : std::move(type);
  return e;
}

ApiError api_error_from_status(const absl::Status& status) {
  int http = 500;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      http = 400;
      break;
    case absl::StatusCode::kNotFound:
      http = 404;
      break;
    case absl::StatusCode::kUnauthenticated:
      http = 401;
      break;
    case absl::StatusCode::kResourceExhausted:
      http = 429;
      break;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kFailedPrecondition:
      http = 503;
      break;
    default:
      break;
  }
  std::string message(status.message());
  std::string param;
  if (http == 400) {
    auto p = status.GetPayload(kParamPayload);
    param = p ? std::string(*p) : param_of(message);
  }
  return make_api_error(http, message, std::move(param));
}

absl::Status with_param(absl::Status status, std::string_view param) {
  status.SetPayload(kParamPayload, absl::Cord(std::string(param)));
  return status;
}

std::string api_error_json(const ApiError& e) {
  nlohmann::json j = {{"error",
                       {{"message", e.message},
                        {"type", e.type},
                        {"param", e.param.empty() ? nlohmann::json() : nlohmann::json(e.param)},
                        {"code", e.code.empty() ? nlohmann::json() : nlohmann::json(e.code)}}}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace loom
