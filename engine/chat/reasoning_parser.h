// Reasoning ("thinking") split off the start of a generation, as Kimi-K2-Thinking, Kimi-K2.5 and
// DeepSeek-V3.1 write it: `<think>REASONING</think>ANSWER`, or, when the prompt already opened the
// block, `REASONING</think>ANSWER`. One-shot (split_reasoning) and streaming
// (ReasoningStreamParser) run the same state machine, so any split of a text accumulates to the
// one-shot result. Rules in docs/chat.md.
#pragma once

#include <string>
#include <string_view>

namespace loom {

inline constexpr std::string_view kThinkBegin = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";

// Whether a rendered chat prompt leaves the model inside a reasoning block: it ends with <think>,
// trailing whitespace allowed (DeepSeek-V3.1 with thinking=true, Kimi-K2.5 by default).
bool prompt_opens_reasoning(std::string_view prompt);

// A text, or a piece of one, split into reasoning and what follows it.
struct ReasoningSplit {
  std::string reasoning;
  std::string answer;  // content and tool calls, for the tool-call parser
};

// Incremental splitter for one generation. Not thread-safe; one per request.
class ReasoningStreamParser {
 public:
  // `starts_inside`: the prompt opened the block (prompt_opens_reasoning), so everything up to the
  // first </think> is reasoning, all of the text when none comes. Otherwise only a generation
  // that begins with <think> has reasoning, up to the first </think> after it.
  explicit ReasoningStreamParser(bool starts_inside);

  // Consumes the next piece; returns what became unambiguous. A trailing prefix of the marker
  // that may still complete ("</thi") is held back.
  ReasoningSplit feed(std::string_view text);
  // Ends the generation: held-back text is what it is. Call once, last.
  ReasoningSplit finish();

 private:
  enum class State {
    kStart,      // outside; whether the text begins with <think> is not known yet
    kReasoning,  // inside the block
    kAnswer,     // after the block, or there is none: everything else is answer
  };
  void run(bool eof, ReasoningSplit* out);

  State state_;
  std::string held_;  // received, not yet decided
  bool finished_ = false;
};

// Splits a complete generated text (the one-shot ReasoningStreamParser).
ReasoningSplit split_reasoning(std::string_view text, bool starts_inside);

}  // namespace loom
