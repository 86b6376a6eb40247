// ChoiceText: the text side of one choice's stream. Sampled tokens become UTF-8 deltas
// (StreamingDetokenizer) and stop strings are cut out of them (StopChecker, which holds back text
// that could still become one). Owned by the engine loop thread with its choice.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/stop_checker.h"
#include "engine/tokenizer/tokenizer.h"

namespace loom {

class ChoiceText {
 public:
  // `tokenizer` may be null: the choice then streams token ids only and all its text is empty.
  // `stops` needs a tokenizer (Engine::submit refuses stop strings without one).
  ChoiceText(const Tokenizer* tokenizer, const std::vector<std::string>& stops);

  // The text `token` completes. Once `stop_strings_apply` (min_tokens are out), a stop string
  // ends the text before it and sets *stopped; before that, text held back for a possible match
  // is released with this token's and a match does nothing.
  std::string push(int32_t token, bool stop_strings_apply, bool* stopped);
  // The text still held back when the choice ends (an incomplete UTF-8 tail, a possible stop
  // string's start); empty once a stop string matched, since nothing after it is output.
  std::string finish();

 private:
  std::unique_ptr<StreamingDetokenizer> detok_;  // null without a tokenizer
  std::unique_ptr<StopChecker> stop_;            // null without stop strings
  bool ended_ = false;                           // a stop string matched
};

}  // namespace loom
