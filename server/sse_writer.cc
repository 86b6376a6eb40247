#include "server/sse_writer.h"

namespace loom {

std::string sse_event(std::string_view payload) {
  std::string out;
  out.reserve(payload.size() + 8);
  out += "data: ";
  for (char c : payload) out += (c == '\n' || c == '\r') ? ' ' : c;
  out += "\n\n";
  return out;
}

std::string sse_done() { return "data: [DONE]\n\n"; }

std::string sse_response_head(bool chunked) {
  std::string head =
      "HTTP/1.1 200 OK\r\n"
      "Content-Type: text/event-stream; charset=utf-8\r\n"
      "Cache-Control: no-cache\r\n";
  head += chunked ? "Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n"
                  : "Connection: close\r\n\r\n";
  return head;
}

}  // namespace loom
