// HttpReply: a complete (non-streaming) HTTP response, and its HTTP/1.1 wire bytes. Streaming
// responses are written as a head (sse_response_head) and chunks (http_chunk).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "server/openai_error.h"

namespace loom {

struct HttpReply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers
};

HttpReply json_reply(int status, std::string body);
HttpReply error_reply(const ApiError& error);

// Status line, headers (Content-Length, Connection), blank line and body.
std::string serialize_reply(const HttpReply& reply, bool keep_alive);
// One chunk of chunked transfer encoding ("<hex size>\r\n<data>\r\n"); empty data is not allowed
// (it would end the body): use http_last_chunk().
std::string http_chunk(std::string_view data);
std::string http_last_chunk();

std::string_view http_reason(int status);

}  // namespace loom
