// Incremental parser of a server-sent-events byte stream
// (https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation).
// Bytes arrive in arbitrary pieces (TCP segments, HTTP chunks); events come out whole. Lines end in
// LF, CR or CRLF (a CR at the end of one piece waits to see whether LF starts the next); `data`
// fields of one event join with "\n"; comments (":") and unknown fields are skipped; a blank line
// dispatches the event unless it has no data.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace loom::client {

struct SseEvent {
  std::string event;  // the `event:` field; empty means "message"
  std::string data;
  std::string id;
};

class SseReader {
 public:
  using Callback = std::function<void(const SseEvent&)>;

  // A line, or an event's data, longer than `max_line_bytes` fails the stream, so a broken or
  // hostile server cannot make the client buffer without bound.
  explicit SseReader(size_t max_line_bytes = 16 << 20) : max_line_bytes_(max_line_bytes) {}

  // Feeds the next piece of the stream; calls `on_event` for every event it completes. After an
  // error the reader stays failed.
  absl::Status feed(std::string_view bytes, const Callback& on_event);

 private:
  void process_line(std::string_view line, const Callback& on_event);

  size_t max_line_bytes_;
  std::string line_;
  SseEvent pending_;
  bool has_data_ = false;
  bool after_cr_ = false;  // the previous piece ended in CR: a leading LF belongs to it
  bool at_start_ = true;   // a UTF-8 BOM is skipped only at the very start
  absl::Status status_;
};

}  // namespace loom::client
