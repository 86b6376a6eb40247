#include "clients/cpp/sse_reader.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace loom::client {
namespace {

struct Collected {
  std::vector<SseEvent> events;
  SseReader::Callback callback() {
    return [this](const SseEvent& e) { events.push_back(e); };
  }
};

std::vector<std::string> data_of(const std::vector<SseEvent>& events) {
  std::vector<std::string> out;
  for (const SseEvent& e : events) out.push_back(e.data);
  return out;
}

// The stream loom-server writes: one `data:` line per event, blank line separators, [DONE].
const std::string kOpenAiStream =
    "data: {\"a\":1}\n\n"
    "data: {\"b\":\"x y\"}\n\n"
    ": keep-alive comment\n\n"
    "data: [DONE]\n\n";

TEST(SseReader, ReadsOpenAiFraming) {
  SseReader r;
  Collected c;
  ASSERT_TRUE(r.feed(kOpenAiStream, c.callback()).ok());
  EXPECT_EQ(data_of(c.events),
            (std::vector<std::string>{"{\"a\":1}", "{\"b\":\"x y\"}", "[DONE]"}));
}

TEST(SseReader, EverySplitPointGivesTheSameEvents) {
  for (size_t cut = 0; cut <= kOpenAiStream.size(); ++cut) {
    SseReader r;
    Collected c;
    ASSERT_TRUE(r.feed(std::string_view(kOpenAiStream).substr(0, cut), c.callback()).ok());
    ASSERT_TRUE(r.feed(std::string_view(kOpenAiStream).substr(cut), c.callback()).ok());
    EXPECT_EQ(data_of(c.events),
              (std::vector<std::string>{"{\"a\":1}", "{\"b\":\"x y\"}", "[DONE]"}))
        << "split at " << cut;
  }
}

TEST(SseReader, LineEndingsCrLfAndCrAndByteByByte) {
  // The same two events with CRLF, CR and LF line ends, fed one byte at a time (a CR that ends
  // one piece must not become an extra blank line when the next piece starts with LF).
  const std::string stream = "data: one\r\ndata: two\r\n\r\nevent: x\rdata:three\r\r";
  SseReader r;
  Collected c;
  for (char ch : stream) ASSERT_TRUE(r.feed(std::string_view(&ch, 1), c.callback()).ok());
  ASSERT_EQ(c.events.size(), 2u);
  EXPECT_EQ(c.events[0].data, "one\ntwo");  // data lines join with LF
  EXPECT_EQ(c.events[0].event, "");
  EXPECT_EQ(c.events[1].data, "three");  // no space after the colon: kept as is
  EXPECT_EQ(c.events[1].event, "x");
}

TEST(SseReader, FieldRules) {
  SseReader r;
  Collected c;
  ASSERT_TRUE(r.feed("\xEF\xBB\xBF"  // a BOM at the start is skipped
                     "id: 7\nretry: 10\nunknown: q\ndata\ndata:  two spaces\n\n"
                     "event: only-event\n\n"  // no data: not dispatched
                     "data: last\n",          // no blank line yet: not dispatched
                     c.callback())
                  .ok());
  ASSERT_EQ(c.events.size(), 1u);
  EXPECT_EQ(c.events[0].data, "\n two spaces");  // `data` with no colon is an empty line of data
  EXPECT_EQ(c.events[0].id, "7");
  ASSERT_TRUE(r.feed("\n", c.callback()).ok());
  ASSERT_EQ(c.events.size(), 2u);
  EXPECT_EQ(c.events[1].data, "last");
  EXPECT_EQ(c.events[1].event, "");  // the event name was reset by the undispatched blank line
}

TEST(SseReader, BomSplitAcrossPieces) {
  SseReader r;
  Collected c;
  ASSERT_TRUE(r.feed("\xEF", c.callback()).ok());
  ASSERT_TRUE(r.feed("\xBB", c.callback()).ok());
  ASSERT_TRUE(r.feed("\xBF"
                     "data: x\n\n",
                     c.callback())
                  .ok());
  ASSERT_EQ(data_of(c.events), std::vector<std::string>{"x"});
}

TEST(SseReader, OverlongLineFailsAndStaysFailed) {
  SseReader r(/*max_line_bytes=*/64);
  Collected c;
  EXPECT_TRUE(r.feed("data: short\n\n", c.callback()).ok());
  EXPECT_FALSE(r.feed(std::string(100, 'x'), c.callback()).ok());
  EXPECT_FALSE(r.feed("\n\ndata: more\n\n", c.callback()).ok());
  EXPECT_EQ(c.events.size(), 1u);
}

TEST(SseReader, OverlongEventOfManyShortLinesFails) {
  SseReader r(/*max_line_bytes=*/64);
  Collected c;
  absl::Status s;
  for (int i = 0; i < 20 && s.ok(); ++i) s = r.feed("data: 0123456789\n", c.callback());
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(c.events.empty());
}

TEST(SseReader, RandomPiecesMatchWholeFeed) {
  // Random events with random line endings, cut at random points: the events equal those of
  // feeding the stream whole.
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 200; ++trial) {
    std::string stream;
    std::vector<std::string> expected;
    const char* endings[] = {"\n", "\r", "\r\n"};
    int n = 1 + static_cast<int>(rng() % 6);
    for (int e = 0; e < n; ++e) {
      std::string payload;
      int lines = 1 + static_cast<int>(rng() % 3);
      for (int l = 0; l < lines; ++l) {
        std::string line;
        for (int k = 0; k < static_cast<int>(rng() % 12); ++k)
          line += static_cast<char>('a' + rng() % 26);
        stream += "data: " + line + endings[rng() % 3];
        payload += (l ? "\n" : "") + line;
      }
      // After a bare CR, an LF would join it into one CRLF line end rather than a blank line.
      stream += stream.back() == '\r' ? endings[1 + rng() % 2] : endings[rng() % 3];
      expected.push_back(payload);
    }
    SseReader r;
    Collected c;
    size_t pos = 0;
    while (pos < stream.size()) {
      size_t len = 1 + rng() % 7;
      ASSERT_TRUE(r.feed(std::string_view(stream).substr(pos, len), c.callback()).ok());
      pos += len;
    }
    ASSERT_EQ(data_of(c.events), expected) << "trial " << trial;
  }
}

}  // namespace
}  // namespace loom::client
