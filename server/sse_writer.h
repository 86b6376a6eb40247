// Server-sent events framing (https://html.spec.whatwg.org/multipage/server-sent-events.html) as
// the OpenAI API uses it: each event is one `data: <json>` line followed by a blank line, and the
// stream ends with `data: [DONE]`. The HTTP layer wraps these bytes in chunked transfer encoding.
#pragma once

#include <string>
#include <string_view>

namespace loom {

// "data: " + payload + "\n\n". `payload` must not contain a newline (compact JSON never does);
// any CR/LF in it is replaced by a space so one event stays one line.
std::string sse_event(std::string_view payload);
// "data: [DONE]\n\n".
std::string sse_done();
// The response header block of an SSE stream (HTTP/1.1, chunked), ending with the blank line.
std::string sse_response_head();

}  // namespace loom
