// StopChecker against a whole-text reference, at every way of cutting the text into pushes: the
// emitted text is always a prefix of the final answer (nothing that later turns out to start a stop
// string leaks), a completed stop string ends the text right before the leftmost match, several
// stop strings pick the leftmost, and flush() returns everything held back.
#include "engine/stop_checker.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace loom {
namespace {

// What a client must end up with when `text` arrives in the pieces cut at `cuts`: after each piece
// the whole text so far is searched; the first piece that completes a stop string ends the output
// right before the leftmost match among the stop strings.
struct Expected {
  std::string text;
  bool stopped = false;
};
Expected reference(const std::string& text, const std::vector<size_t>& cuts,
                   const std::vector<std::string>& stops) {
  for (size_t end : cuts) {
    const std::string so_far = text.substr(0, end);
    size_t first = std::string::npos;
    for (const std::string& s : stops) first = std::min(first, so_far.find(s));
    if (first != std::string::npos) return {so_far.substr(0, first), true};
  }
  return {text, false};
}

// Feeds the pieces; checks the prefix property after every push; returns what was emitted.
Expected run(const std::string& text, const std::vector<size_t>& cuts,
             const std::vector<std::string>& stops, const std::string& final_text) {
  StopChecker checker(stops);
  Expected got;
  size_t begin = 0;
  for (size_t end : cuts) {
    bool stopped = false;
    got.text += checker.push(std::string_view(text).substr(begin, end - begin), &stopped);
    EXPECT_EQ(final_text.compare(0, got.text.size(), got.text), 0)
        << "emitted '" << got.text << "', not a prefix of '" << final_text << "'";
    begin = end;
    if (stopped) {
      got.stopped = true;
      return got;
    }
  }
  got.text += checker.flush();
  return got;
}

void check_all_splits(const std::string& text, const std::vector<std::string>& stops) {
  // Every single cut point (two pieces), and every byte its own piece.
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    std::vector<size_t> cuts = {cut, text.size()};
    const Expected want = reference(text, cuts, stops);
    const Expected got = run(text, cuts, stops, want.text);
    EXPECT_EQ(got.text, want.text) << "text '" << text << "' cut at " << cut;
    EXPECT_EQ(got.stopped, want.stopped) << "text '" << text << "' cut at " << cut;
  }
  std::vector<size_t> bytes;
  for (size_t i = 1; i <= text.size(); ++i) bytes.push_back(i);
  const Expected want = reference(text, bytes, stops);
  const Expected got = run(text, bytes, stops, want.text);
  EXPECT_EQ(got.text, want.text) << "text '" << text << "' byte by byte";
  EXPECT_EQ(got.stopped, want.stopped);
}

TEST(StopChecker, NoStopStringsPassesEverything) {
  StopChecker c({});
  bool stopped = true;
  EXPECT_EQ(c.push("abc", &stopped), "abc");
  EXPECT_FALSE(stopped);
  EXPECT_EQ(c.flush(), "");
}

TEST(StopChecker, HoldsBackAPartialMatchAndFlushesItAtTheEnd) {
  StopChecker c({"END"});
  bool stopped = false;
  EXPECT_EQ(c.push("abcE", &stopped), "abc");
  EXPECT_EQ(c.push("N", &stopped), "");
  EXPECT_FALSE(stopped);
  // The stream ends (max_tokens) inside the partial match: the held text is the client's.
  EXPECT_EQ(c.flush(), "EN");
  EXPECT_EQ(c.flush(), "");
}

TEST(StopChecker, StopEndsTextAndDropsTheRest) {
  StopChecker c({"END"});
  bool stopped = false;
  EXPECT_EQ(c.push("xxEN", &stopped), "xx");
  EXPECT_EQ(c.push("Dyy", &stopped), "");
  EXPECT_TRUE(stopped);
}

TEST(StopChecker, LeftmostOfSeveralWins) {
  StopChecker c({"cd", "bcx", "b"});
  bool stopped = false;
  EXPECT_EQ(c.push("abcd", &stopped), "a");  // "b" at 1 and "cd" at 2 both complete: "b" wins
  EXPECT_TRUE(stopped);
  StopChecker d({"zzz", "yy"});
  EXPECT_EQ(d.push("ayyzzz", &stopped), "a");
  EXPECT_TRUE(stopped);
}

TEST(StopChecker, EverySplitPoint) {
  check_all_splits("the end is near, THE END", {"END"});
  check_all_splits("aaab", {"aab"});  // the held suffix must restart inside itself
  check_all_splits("abcabd", {"abd", "ca"});
  check_all_splits("no stop here at all", {"xyz", "zz"});
  check_all_splits("stop at the very start", {"stop"});
  check_all_splits("ends with a partial ST", {"STOP"});
  check_all_splits("caf\xC3\xA9 na\xC3\xAFve", {"\xC3\xAFv"});  // multi-byte stop
}

TEST(StopChecker, RandomTextsAndStops) {
  std::mt19937 rng(7);
  auto random_string = [&](int max_len) {
    std::string s(std::uniform_int_distribution<int>(1, max_len)(rng), 'a');
    for (char& ch : s) ch = static_cast<char>('a' + rng() % 3);
    return s;
  };
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::string> stops;
    const int n = 1 + static_cast<int>(rng() % 3);
    for (int i = 0; i < n; ++i) stops.push_back(random_string(4));
    check_all_splits(random_string(14), stops);
  }
}

}  // namespace
}  // namespace loom
