#include "server/http_response.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status.h"

namespace loom {

HttpReply json_reply(int status, std::string body) {
  HttpReply r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

HttpReply error_reply(const ApiError& error) {
  return json_reply(error.http_status, api_error_json(error));
}

std::string_view http_reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 413:
      return "Payload Too Large";
    case 415:
      return "Unsupported Media Type";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Unknown";
  }
}

std::string serialize_reply(const HttpReply& r, bool keep_alive) {
  std::string out =
      absl::StrCat("HTTP/1.1 ", r.status, " ", absl_sv(http_reason(r.status)),
                   "\r\nContent-Type: ", r.content_type, "\r\nContent-Length: ", r.body.size(),
                   "\r\nConnection: ", keep_alive ? "keep-alive" : "close", "\r\n");
  for (const auto& [k, v] : r.headers) absl::StrAppend(&out, k, ": ", v, "\r\n");
  absl::StrAppend(&out, "\r\n", r.body);
  return out;
}

std::string http_chunk(std::string_view data) {
  return absl::StrCat(absl::StrFormat("%x", data.size()), "\r\n", absl_sv(data), "\r\n");
}

std::string http_last_chunk() { return "0\r\n\r\n"; }

}  // namespace loom
