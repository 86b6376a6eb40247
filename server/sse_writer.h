// Server-sent events framing (https://html.spec.whatwg.org/multipage/server-sent-events.html) as
// the OpenAI API uses it: each event is one `data: <json>` line followed by a blank line, and the
// stream ends with `data: [DONE]`. The HTTP layer wraps these bytes in chunked transfer encoding
// (HTTP/1.1) or sends them as they are and closes (HTTP/1.0).
#pragma once

#include <string>
#include <string_view>

namespace loom {

// "data: " + payload + "\n\n". `payload` must not contain a newline (compact JSON never does);
// any CR/LF in it is replaced by a space so one event stays one line.
std::string sse_event(std::string_view payload);
// "data: [DONE]\n\n".
std::string sse_done();
// The response header block of an SSE stream, ending with the blank line: chunked and kept
// alive, or (`chunked` false, for HTTP/1.0 clients, which do not know chunked coding: RFC 9112
// 6.1) delimited by closing the connection.
std::string sse_response_head(bool chunked = true);

}  // namespace loom
