// StopChecker: finds stop strings in streamed text without ever emitting a prefix of one that later
// completes (text that could still be the start of a stop string is held back).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace loom {

class StopChecker {
 public:
  explicit StopChecker(std::vector<std::string> stops);

  // Appends `text`; returns what may be emitted now. When a stop string completes, returns the
  // text before it, sets *stopped and drops everything after (OpenAI semantics: the stop string
  // itself is not returned).
  std::string push(std::string_view text, bool* stopped);
  // The held-back text, at the end of the stream (no stop string completed).
  std::string flush();

 private:
  std::vector<std::string> stops_;
  std::string held_;
};

}  // namespace loom
