#include "engine/chat/reasoning_parser.h"

#include <algorithm>

namespace loom {
namespace {

// Length of the longest suffix of `s` that is a proper prefix of `marker`.
size_t partial_suffix(std::string_view s, std::string_view marker) {
  for (size_t len = std::min(s.size(), marker.size() - 1); len > 0; --len) {
    if (s.substr(s.size() - len) == marker.substr(0, len)) return len;
  }
  return 0;
}

}  // namespace

bool prompt_opens_reasoning(std::string_view prompt) {
  const size_t last = prompt.find_last_not_of(" \n\t\r");
  if (last == std::string_view::npos) return false;
  prompt = prompt.substr(0, last + 1);
  return prompt.size() >= kThinkBegin.size() &&
         prompt.substr(prompt.size() - kThinkBegin.size()) == kThinkBegin;
}

ReasoningStreamParser::ReasoningStreamParser(bool starts_inside)
    : state_(starts_inside ? State::kReasoning : State::kStart) {}

void ReasoningStreamParser::run(bool eof, ReasoningSplit* out) {
  std::string_view s = held_;
  if (state_ == State::kStart) {
    const size_t n = std::min(s.size(), kThinkBegin.size());
    const bool opens = s.substr(0, n) == kThinkBegin.substr(0, n);
    if (opens && n < kThinkBegin.size() && !eof) return;  // a prefix of <think>: wait for the rest
    if (opens && n == kThinkBegin.size()) {
      s.remove_prefix(n);
      state_ = State::kReasoning;
    } else {
      state_ = State::kAnswer;
    }
  }
  if (state_ == State::kReasoning) {
    const size_t end = s.find(kThinkEnd);
    if (end == std::string_view::npos) {
      const size_t hold = eof ? 0 : partial_suffix(s, kThinkEnd);
      out->reasoning.append(s.substr(0, s.size() - hold));
      held_ = std::string(s.substr(s.size() - hold));
      return;
    }
    out->reasoning.append(s.substr(0, end));
    s.remove_prefix(end + kThinkEnd.size());
    state_ = State::kAnswer;
  }
  out->answer.append(s);
  held_.clear();
}

ReasoningSplit ReasoningStreamParser::feed(std::string_view text) {
  ReasoningSplit out;
  if (finished_) return out;
  held_.append(text);
  run(/*eof=*/false, &out);
  return out;
}

ReasoningSplit ReasoningStreamParser::finish() {
  ReasoningSplit out;
  if (finished_) return out;
  run(/*eof=*/true, &out);
  finished_ = true;
  held_.clear();
  return out;
}

ReasoningSplit split_reasoning(std::string_view text, bool starts_inside) {
  ReasoningStreamParser parser(starts_inside);
  ReasoningSplit out = parser.feed(text);
  ReasoningSplit tail = parser.finish();
  out.reasoning += tail.reasoning;
  out.answer += tail.answer;
  return out;
}

}  // namespace loom
