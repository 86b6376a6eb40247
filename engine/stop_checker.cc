#include "engine/stop_checker.h"

#include <algorithm>

namespace loom {

StopChecker::StopChecker(std::vector<std::string> stops) : stops_(std::move(stops)) {}

std::string StopChecker::push(std::string_view text, bool* stopped) {
  *stopped = false;
  if (stops_.empty()) return std::string(text);
  held_.append(text);
  // The earliest completed stop string wins.
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, held_.find(s));
  if (first != std::string::npos) {
    *stopped = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    for (size_t len = std::min(s.size() - 1, held_.size()); len > keep; --len) {
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        keep = len;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopChecker::flush() {
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace loom
