// Fuzzes what loom-cli and loom-bench read from a server: any bytes as a server-sent-events stream
// (clients/cpp/sse_reader.cc), fed whole and again in pieces whose cut points come from the input,
// and every event's data through the OpenAI stream-chunk parser (clients/cpp/openai_stream.cc).
// Nothing may crash or leak, and the pieces must give exactly the events of the whole feed.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "clients/cpp/openai_stream.h"
#include "clients/cpp/sse_reader.h"

namespace {

struct Result {
  bool ok = true;
  std::vector<std::string> data;
};

Result feed_in_pieces(std::string_view stream, std::string_view cuts) {
  loom::client::SseReader reader(/*max_line_bytes=*/1024);
  Result r;
  auto on_event = [&](const loom::client::SseEvent& e) { r.data.push_back(e.data); };
  size_t pos = 0;
  size_t i = 0;
  while (pos < stream.size()) {
    size_t len =
        cuts.empty() ? stream.size() : 1 + static_cast<uint8_t>(cuts[i++ % cuts.size()]) % 16;
    if (!reader.feed(stream.substr(pos, len), on_event).ok()) {
      r.ok = false;
      break;
    }
    pos += len;
  }
  return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(bytes), size);
  // The first 8 bytes choose the cut points; the rest is the stream.
  std::string_view cuts = in.substr(0, std::min<size_t>(8, in.size()));
  std::string_view stream = in.substr(cuts.size());
  Result whole = feed_in_pieces(stream, "");
  Result pieces = feed_in_pieces(stream, cuts);
  // An over-long line fails both; otherwise the cut points must not matter.
  if (whole.ok && pieces.ok && whole.data != pieces.data) std::abort();
  for (const std::string& d : whole.data) {
    (void)loom::client::parse_stream_chunk(d, /*chat=*/false);
    (void)loom::client::parse_stream_chunk(d, /*chat=*/true);
    (void)loom::client::parse_completion(d, /*chat=*/true);
  }
  return 0;
}
